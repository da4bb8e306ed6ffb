"""Stand-in peers for the isolation tests. A spawned child imports this module by name to build them, so it stays
tiny: no pytest, no torch."""

import os
import signal
import time


def echo(prefix: int):
    """A well-behaved peer: decodes `ids` to `[prefix, *ids]`, reporting its OMP_NUM_THREADS as tau."""

    def decode(ids):
        t = time.perf_counter()
        return [prefix, *ids], time.perf_counter() - t, os.environ.get("OMP_NUM_THREADS")

    return decode


def dies_on(bad_token: int, signum: int = signal.SIGILL):
    """Decodes like `echo(0)` until a prompt contains `bad_token`, then kills itself with `signum`, as a llama.cpp
    built for another CPU does on its first illegal instruction."""

    def decode(ids):
        if bad_token in ids:
            os.kill(os.getpid(), signum)
        return [0, *ids], 0.0, None

    return decode


def dies_while_loading():
    os.kill(os.getpid(), signal.SIGSEGV)


def raises_while_loading():
    raise FileNotFoundError("no such model.gguf")
