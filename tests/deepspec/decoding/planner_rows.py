"""What the planner's tests hand it: duck-typed rows and a step clock the test advances itself."""

from __future__ import annotations

from types import SimpleNamespace

from deepspec.decoding import step_timing
from deepspec.decoding.params import SamplingParams
from deepspec.decoding.verify_budget import EstimateCalibration


def greedy_rows(n: int, cache_len: int = 0) -> list:
    """n duck-typed greedy sequences as the planner reads them (planner module docstring), each `cache_len` deep."""
    return [
        SimpleNamespace(
            params=SamplingParams(),
            stats=SimpleNamespace(proposed_per_position=[], accepted_per_position=[]),
            calibration=EstimateCalibration(),
            cache_len=cache_len,
            sequence_id=i + 1,
        )
        for i in range(n)
    ]


def pin_step_clock(monkeypatch) -> list[float]:
    """step_timing's clock reads the returned cell: a fake target advances it by the time its pass would take."""
    now = [0.0]
    monkeypatch.setattr(step_timing, "clock", lambda: now[0])
    return now
