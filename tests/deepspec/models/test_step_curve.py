"""measure_step_curve on a scripted clock: the median of each size's runs for tables, the fastest for a curve that
is recorded (load only ever slows a run), and the recorded curve's own repeat count."""

from __future__ import annotations

from types import SimpleNamespace

import deepspec.models.step_curve as step_curve


class _ScriptedTarget:
    """A target whose T-token forward takes the next of `durations[T]` seconds on the module's clock."""

    vocab_size = 16

    def __init__(self, durations: dict[int, list[float]], clock: list[float]):
        self.durations, self.clock = {n: list(d) for n, d in durations.items()}, clock

    def new_cache(self, rows, length):
        return SimpleNamespace(rows=lambda first, count: None)

    def forward(self, tokens, start, view, feature_layers=(), logits="all", max_start=0):
        n = tokens.shape[1]
        if n in self.durations:  # the context's prefill takes no time
            self.clock[0] += self.durations[n].pop(0)


def _measure(monkeypatch, durations, **kw):
    clock = [0.0]
    monkeypatch.setattr(step_curve.time, "perf_counter", lambda: clock[0])
    return step_curve.measure_step_curve(_ScriptedTarget(durations, clock), sizes=(1, 2), context=4, repeats=3, **kw)


def test_the_median_for_tables_and_the_fastest_for_a_recorded_curve(monkeypatch):
    durations = {1: [9.0, 5.0, 1.0, 3.0], 2: [9.0, 4.0, 6.0, 2.0]}  # the first run of each size is the warm-up
    assert _measure(monkeypatch, durations) == {1: 3.0, 2: 4.0}
    assert _measure(monkeypatch, durations, fastest=True) == {1: 1.0, 2: 2.0}


def test_the_recorded_curve_takes_the_fastest_of_its_repeats(monkeypatch):
    calls = []
    monkeypatch.setattr(step_curve, "measure_step_curve", lambda target, **kw: calls.append(kw) or {1: 1.0})
    assert step_curve.measure_recorded_curve(object()) == {1: 1.0}
    assert calls == [{"repeats": step_curve.RECORD_REPEATS, "fastest": True}] and step_curve.RECORD_REPEATS > 7
