"""Run one benchmark method in a process of its own, so that its crash costs its row and not the whole run.

A peer built from native code (llama.cpp through llama-cpp-python) can die in ways Python cannot catch: a wheel
compiled for the build machine's CPU (AMX, AVX-512) executes an illegal instruction elsewhere and the kernel sends
SIGILL. In-process, that killed `bench.decode` and every other row with it. Here the method is built and called in a
child process (spawned: nothing of the parent's torch or OpenMP state is inherited); the parent sends it prompts over a
pipe and reads back `(tokens, seconds, tau)`. The seconds are measured in the child around the decode alone, so the
pipe's cost is not in the numbers and the methods still run interleaved, prompt by prompt.

    decoder = IsolatedDecoder(llama_cpp_decoder, gguf_path, 128, warmup_ids, 2, threads=2)
    tokens, seconds, tau = decoder(prompt_ids)     # PeerFailed("crashed: signal 4 (SIGILL)") if the child died
    decoder.close()
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet

#: longest wait for a child to build its method (load a model, warm up) or to decode one prompt
DEFAULT_TIMEOUT_S = 900.0


class PeerFailed(RuntimeError):
    """The method's process died, timed out or raised; `str(e)` is the short status its row shows."""


def describe_exit(exitcode: int | None) -> str:
    """`crashed: signal 4 (SIGILL)` for a child killed by a signal, `exited with status N` otherwise."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            return f"crashed: signal {-exitcode}"
        return f"crashed: signal {-exitcode} ({name})"
    return f"exited with status {exitcode}"


def _serve(conn, build: Callable, args: tuple) -> None:
    """The child's loop: build the method once, then answer one prompt per message until None or EOF."""
    try:
        decode = build(*args)
    except Exception as e:
        conn.send(("error", f"failed to start: {type(e).__name__}: {e}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            ids = conn.recv()
        except EOFError:
            return
        if ids is None:
            return
        try:
            result = decode(ids)
        except Exception as e:
            conn.send(("error", f"failed: {type(e).__name__}: {e}"))
            return
        conn.send(("ok", result))


class IsolatedDecoder:
    """`build(*args)` → `decode(ids) -> (tokens, seconds, tau)`, run in a spawned child process.

    `build` must be importable by name (a module-level function) since the child starts a fresh interpreter.
    `threads` sets the child's OMP_NUM_THREADS: a child with its own OpenMP runtime would otherwise size its pool
    to every core, and its idle threads, spinning after each token, would take cores from the method decoding next.
    """

    def __init__(self, build: Callable, *args, threads: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.timeout_s = timeout_s
        ctx = mp.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child_conn, build, args), daemon=True)
        saved = os.environ.get("OMP_NUM_THREADS")
        if threads is not None:  # the spawned child copies os.environ when it starts
            os.environ["OMP_NUM_THREADS"] = str(threads)
        try:
            self.process.start()
        finally:
            if threads is not None:
                if saved is None:
                    os.environ.pop("OMP_NUM_THREADS", None)
                else:
                    os.environ["OMP_NUM_THREADS"] = saved
        child_conn.close()  # the child holds the only write end now: its death is an EOF here
        self._receive("starting")

    def __call__(self, ids: Sequence[int]):
        try:
            self._conn.send(list(ids))
        except (BrokenPipeError, OSError):
            raise PeerFailed(self._died()) from None
        return self._receive("decoding")

    def _receive(self, doing: str):
        if not self._conn.poll(self.timeout_s):
            self.process.kill()
            self.process.join(5)
            raise PeerFailed(f"timed out after {self.timeout_s:.0f} s {doing}")
        try:
            kind, value = self._conn.recv()
        except EOFError:
            raise PeerFailed(self._died()) from None
        if kind == "error":
            self.close()
            raise PeerFailed(value)
        return value

    def _died(self) -> str:
        self.process.join(10)
        return describe_exit(self.process.exitcode)

    def close(self) -> None:
        """Ask the child to finish, then make sure it has."""
        if self.process.is_alive():
            try:
                self._conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self.process.join(10)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(5)
        self._conn.close()


class MethodTable:
    """The decoders one benchmark compares, by row name. `add` builds and warms one up; a peer that dies while
    starting (`PeerFailed`) costs its row only, recorded in `failed_to_start` with the reason."""

    def __init__(self, log: Callable[[str], None], skip: AbstractSet[str] = frozenset()):
        self.log, self.skip = log, skip
        self.decoders: dict[str, object] = {}
        self.failed_to_start: dict[str, str] = {}

    def add(self, name: str, build: Callable[[], object]) -> None:
        if name in self.skip:
            return
        self.log(f"loading and warming up {name}")
        try:
            self.decoders[name] = build()
        except PeerFailed as e:
            self.log(f"[red]{name} {e}: its row is left out, the other methods go on")
            self.failed_to_start[name] = str(e)
