"""torch's intra-op threads while an engine step runs, for targets that bring a thread pool of their own.

A target whose forward runs in its own pool (ONNX Runtime's, spinning within its run) shares the cores with torch's
OpenMP workers, which the engine's own torch ops wake (a sampled row's softmax and cumsum over the vocabulary) and
which then spin after each parallel region; spinning on the cores ONNX Runtime's threads need, they made its next
forward ~40% slower (batch-1 sampled decode 55 against 78 tok/s with one torch thread, int8 graph, 2-core Zen 4).
The engine's own ops on a few rows need no second thread, so such a target names a count (`host_threads`).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


@contextmanager
def torch_threads(count: int | None):
    """torch's intra-op thread count set to `count` (this thread's; None: unchanged) for the block, then restored."""
    if count is None or count == torch.get_num_threads():
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
