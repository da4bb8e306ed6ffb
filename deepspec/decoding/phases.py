"""Where an engine step's time goes: wall time per phase of a step, when asked for (`SpecEngine.profile`).

The target's verify forward is the work speculation exists to amortise; everything else a round does — drafting,
the verification budget, grammar walks, the acceptance op, KV compaction, logprobs, committing tokens (stop checks,
incremental detokenization), telling the drafter, moving slots — is overhead that a faster kernel does not remove.
`bench/round_overhead.py` reports these per round. Off by default: an untimed phase is one shared
`nullcontext`. On a CUDA target each timed phase synchronises before and after, so kernels launched in one phase
are not billed to the next (which changes the timings it measures a little: use it to find where time goes, not as
the throughput figure).
"""

from __future__ import annotations

import time
from collections import Counter
from contextlib import contextmanager, nullcontext

import torch

#: the phases a step is split into, in the order a round runs them
PHASES = (
    "prefill",
    "draft",
    "budget",
    "grammar",
    "target",
    "verify",
    "kv",
    "logprobs",
    "commit",
    "draft_update",
    "release",
)

_UNTIMED = nullcontext()


def untimed(_name: str):
    """The phase context when nothing is measured."""
    return _UNTIMED


class _Seconds(dict[str, float]):
    """Seconds per phase: a phase never timed reads 0.0 without being added, as in a Counter (whose counts are
    ints)."""

    def __missing__(self, key: str) -> float:
        return 0.0


class PhaseTimer:
    """Accumulated seconds and entries per phase, and per whole step (`step`, which holds the others)."""

    def __init__(self, device: torch.device):
        self.seconds = _Seconds()
        self.calls: Counter[str] = Counter()
        self._cuda = device.type == "cuda"

    @contextmanager
    def __call__(self, name: str):
        if self._cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self._cuda:
                torch.cuda.synchronize()
            self.seconds[name] += time.perf_counter() - t0
            self.calls[name] += 1

    def per_step_ms(self) -> dict[str, float]:
        """Milliseconds per step of each phase (over every step timed), plus `other`: the step's time that no
        phase holds (Python glue between them)."""
        steps = max(self.calls["step"], 1)
        out = {name: self.seconds[name] * 1e3 / steps for name in PHASES if name in self.seconds}
        out["other"] = max(0.0, (self.seconds["step"] - sum(self.seconds[n] for n in PHASES)) * 1e3 / steps)
        return out
