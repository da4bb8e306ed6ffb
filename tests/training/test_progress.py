"""The ETA of a resumed job: rows finished by an earlier run must not count as this run's speed."""

import math

import pytest

from training import progress as progress_module
from training.progress import Progress


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(progress_module.time, "perf_counter", fake)
    return fake


def test_resumed_rows_move_the_count_but_not_the_eta(clock, capsys):
    with Progress(100, "prepare", log_every_seconds=0) as p:
        p.resume_from(90)
        assert math.isnan(p.eta_seconds)
        clock.now += 10.0
        p.advance(1, tokens=50)
        # one row in 10 s leaves 9 rows → 90 s; counting the 90 resumed rows would promise about 1 s
        assert p.eta_seconds == pytest.approx(90.0)
        assert p.tokens_per_second == pytest.approx(5.0)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("[prepare] 91/100 5 tok/s elapsed 10s eta 90s")


def test_a_fresh_run_estimates_from_its_own_pace(clock):
    with Progress(10, "train", enabled=False) as p:
        clock.now += 4.0
        p.advance(2)
        assert p.eta_seconds == pytest.approx(16.0)
