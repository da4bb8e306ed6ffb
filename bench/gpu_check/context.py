"""What every part is handed: the device, the sizes, a scratch directory with the generated target, and the
clock of its own budget (a part checks `time_left()` between rows and skips the rest when it is spent)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.gpu_check.sizes import Sizes


@dataclass
class Context:
    device: str
    sizes: Sizes
    workdir: Path
    #: the generated Hugging Face target directory (bench/gpu_check/target.py)
    target_dir: Path
    log: object = print
    #: when the running part started and how long it may take (set by the runner before each part)
    part_started: float = field(default_factory=time.perf_counter)
    part_budget_seconds: float = float("inf")

    def time_left(self) -> float:
        return self.part_budget_seconds - (time.perf_counter() - self.part_started)

    def synchronize(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()


def guarded(context: Context, label: str, make_rows) -> list:
    """make_rows() → its rows; one `skipped` row once the part's budget is spent, one `FAIL` row with the exception
    if it raises, so the part's next row still runs."""
    from bench.gpu_check.report import FAIL, SKIPPED, Row

    if context.time_left() <= 0:
        return [Row(label, SKIPPED, "the part's time budget is spent")]
    try:
        return make_rows()
    except Exception as exc:
        return [Row(label, FAIL, f"{type(exc).__name__}: {str(exc)[:300]}")]
