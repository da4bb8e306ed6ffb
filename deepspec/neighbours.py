"""How much of this machine's CPU other processes took while something was measured.

The engine choice (which backend decodes fastest here) and the verification budget's step curve are timings, and a
timing taken beside a busy neighbour describes the neighbour as much as the machine: a worker started next to a test
suite measured ONNX int8 ahead of the native decoder (74 against 69 tok/s) and would have served ONNX on that
machine from then on. `NeighbourShare` measures, around a measurement, the CPU time every other process used, as a
share of the machine's capacity over that time, so a result taken beside busy neighbours can be kept provisional
and taken again at a quieter start.

Read from /proc/stat (all processes) less this process's own CPU time (`os.times`): Linux only; elsewhere the share
is None (unknown), and callers treat unknown as quiet.
"""

from __future__ import annotations

import os
import time

#: a neighbour share at or above this made a measurement provisional: a quarter of the machine is half a core of
#: two, enough to deschedule a decoder thread several times a step
BUSY_SHARE = 0.25


def _system_busy_seconds() -> float | None:
    """CPU seconds all processes have run since boot (user, nice, system, irq, softirq, steal), or None."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(v) for v in fields[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    busy = sum(ticks[:8]) - idle if len(ticks) >= 8 else sum(ticks) - idle
    return busy / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system


class NeighbourShare:
    """`with NeighbourShare() as n: ...` (or `n = NeighbourShare().start()` ... `n.stop()` around a span that is no
    block); afterwards `n.share` is the other processes' CPU time over it as a fraction of all cores' time (0 =
    alone, 1 = every core busy with others), or None where it cannot be read."""

    share: float | None = None

    def start(self) -> NeighbourShare:
        self._wall, self._own, self._busy = time.monotonic(), _own_seconds(), _system_busy_seconds()
        return self

    def __enter__(self) -> NeighbourShare:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        busy = _system_busy_seconds()
        wall = time.monotonic() - self._wall
        if busy is None or self._busy is None or wall <= 0:
            return
        others = (busy - self._busy) - (_own_seconds() - self._own)
        self.share = min(1.0, max(0.0, others / (wall * (os.cpu_count() or 1))))

    @property
    def busy(self) -> bool:
        """Whether the neighbours took enough of the machine to make the measurement provisional (BUSY_SHARE)."""
        return self.share is not None and self.share >= BUSY_SHARE
