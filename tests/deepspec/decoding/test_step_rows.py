"""The budget's step model by rows (verify_budget.StepTimeModel.pass_seconds, step_timing's multi-row probe and
ServedSteps by row count): a pass of several rows is priced on a curve timed on several rows, not on the one-row
curve at the same total tokens, so at 8 rows the budget drafts only where the accepted tokens pay for what the extra
tokens really cost there.

Time is a fake clock that the stub target advances by a made-up cost of (rows, tokens) in each forward: no assert
depends on this machine's speed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from deepspec.decoding import planner as planner_module
from deepspec.decoding import step_timing
from deepspec.decoding.drafter import PaddedProposal
from deepspec.decoding.engine import SpecEngine
from deepspec.decoding.params import SamplingParams
from deepspec.decoding.planner import BudgetPlanner
from deepspec.decoding.step_timing import ServedSteps, StepCurveCache, row_probe_sizes
from deepspec.decoding.verify_budget import StepTimeModel, best_depth, best_row_depths
from service.worker.stub_target import StubDrafter, StubTarget
from tests.deepspec.decoding.planner_rows import greedy_rows, pin_step_clock
from tests.neighbours import set_neighbours

#: the one-row curve the native decoder's probe gave on a Zen 4 (ms by tokens): extra tokens nearly free
ONE_ROW = [(1, 5.0e-3), (8, 9.2e-3), (9, 9.4e-3), (16, 12.2e-3), (32, 18.0e-3)]
#: what 8-row passes at context 200 cost there (ms by total tokens): the first draft alone +2.5 ms
EIGHT_ROWS = [(8, 13.7e-3), (9, 16.2e-3), (12, 19.4e-3), (16, 24.1e-3), (24, 34.4e-3), (32, 44.0e-3)]


def _truth_ms(rows: int, tokens: int, per_draft: float) -> float:
    """The stub's cost of a pass: 4 ms, 0.1 ms a token beyond the first, 1.2 ms a row beyond the first, and on
    several rows `per_draft` ms for each token beyond one a row (rows stream their own weights' worth of work)."""
    ms = 4.0 + 0.1 * (tokens - 1)
    if rows > 1:
        ms += 1.2 * (rows - 1) + per_draft * (tokens - rows)
    return ms


class RowClockedStub(StubTarget):
    """The stub target on a fake clock advanced by `_truth_ms` of each forward's rows and tokens (`per_draft` set
    higher for a probe beside a busy neighbour)."""

    def __init__(self, clock: list[float], per_draft: float = 0.5):
        super().__init__(max_seq_len=512)
        self.clock, self.per_draft = clock, per_draft

    def forward(self, tokens, start, cache=None, **kw):
        self.clock[0] += _truth_ms(tokens.shape[0], tokens.numel(), self.per_draft) / 1e3
        return super().forward(tokens, start, cache, **kw)


@pytest.fixture(autouse=True)
def neighbours(monkeypatch):
    return set_neighbours(monkeypatch, planner_module)


@pytest.fixture
def fake_clock(monkeypatch):
    return pin_step_clock(monkeypatch)


def test_a_model_by_rows_fits_synthetic_timings_and_joins_row_counts_linearly():
    truth = {(r, n): _truth_ms(r, n, 1.5) / 1e3 for r in (1, 2, 4, 8) for n in row_probe_sizes(r, 32, 7, True)}
    model = StepTimeModel(
        [(n, t) for (r, n), t in truth.items() if r == 1],
        rows={r: [(n, t) for (q, n), t in truth.items() if q == r] for r in (2, 4, 8)},
    )
    assert model.by_rows
    for (rows, n), t in truth.items():
        assert model.pass_seconds(rows, n) == pytest.approx(t)
    # between probed sizes the truth is linear in tokens, so is the model; between probed row counts, linear in rows
    assert model.pass_seconds(8, 20) == pytest.approx(_truth_ms(8, 20, 1.5) / 1e3)
    assert model.pass_seconds(6, 12) == pytest.approx(_truth_ms(6, 12, 1.5) / 1e3)
    assert model.pass_seconds(12, 12) > model.pass_seconds(8, 8)  # beyond the largest row count: never cheaper
    # the padded pricing reads the same curves: 8 rows verifying d drafts each is one pass of 8 (d + 1) tokens
    assert model.round_list(8, 2) == pytest.approx([model.pass_seconds(8, 8 * (d + 1)) for d in range(3)])
    # a model without multi-row curves prices a pass by its total tokens, as before
    blind = StepTimeModel([(n, t) for (r, n), t in truth.items() if r == 1])
    assert not blind.by_rows and blind.pass_seconds(8, 16) == blind.seconds(16)
    with pytest.raises(ValueError, match="8-row curve"):
        StepTimeModel(ONE_ROW, rows={8: [(4, 1e-3)]})  # 8 rows hold 8 tokens or more


def test_at_8_rows_a_steep_multi_row_curve_drafts_less_than_one_row_does():
    """The pricing that over-drafted: at 8 rows the one-row curve says 8 more tokens cost 3 ms, and depth 1 pays for
    drafts accepted 60% of the time; timed on 8 rows they cost 10.4 ms and it does not. One row still drafts."""
    blind, by_rows = StepTimeModel(ONE_ROW), StepTimeModel(ONE_ROW, rows={8: EIGHT_ROWS})
    survival = [[0.6, 0.36, 0.2]]
    assert best_depth(survival * 8, blind) >= 1  # today's pricing: drafts at 8 rows
    assert best_depth(survival * 8, by_rows) == 0
    assert best_depth(survival, by_rows) >= 1
    # the planner, padded and ragged alike
    proposal = PaddedProposal(
        torch.ones(8, 3, dtype=torch.long), torch.full((8,), 3), survival=torch.tensor(survival * 8)
    )
    one = PaddedProposal(torch.ones(1, 3, dtype=torch.long), torch.full((1,), 3), survival=torch.tensor(survival))
    for per_row in (False, True):
        planner = BudgetPlanner(learn_online=False, per_row_depths=per_row)
        planner.step_time = by_rows
        assert sum(planner.row_depths(greedy_rows(8), proposal, [3] * 8)) == 0
        assert planner.row_depths(greedy_rows(1), one, [3])[0] >= 1
        planner.step_time = blind
        assert sum(planner.row_depths(greedy_rows(8), proposal, [3] * 8)) > 0  # the test fails on one-row pricing


def test_ranked_depths_on_8_rows_take_only_the_slots_that_pay_there():
    """One confident row among seven doubtful ones: ranked across the batch, the confident row's slots pay even at
    the 8-row price, the doubtful rows' do not."""
    by_rows = StepTimeModel(ONE_ROW, rows={8: EIGHT_ROWS})
    survival = [[0.97, 0.94, 0.91]] + [[0.5, 0.25, 0.1]] * 7
    depths = best_row_depths(survival, lambda d: by_rows.pass_seconds(len(d), sum(d) + len(d)))
    assert depths[0] == 3 and depths[1:] == [0] * 7
    blind = StepTimeModel(ONE_ROW)
    assert sum(best_row_depths(survival, lambda d: blind.seconds(sum(d) + len(d)))) > 3  # one-row pricing: more


def test_the_engine_probes_passes_on_several_rows(fake_clock):
    """A batch of 8 probes 2, 4 and 8 rows at their per-row budgets: the model prices every probed pass as the
    stub's truth, and 8 rows of two tokens far above the one-row curve at 16 tokens."""
    target = RowClockedStub(fake_clock, per_draft=1.5)
    engine = SpecEngine(
        target, StubDrafter(), max_batch_size=8, max_seq_len=512, num_speculative_tokens=4, planner=BudgetPlanner()
    )
    curve = engine.planner.step_time
    assert curve is not None and sorted(curve.row_points()) == [2, 4, 8]
    for rows, points in curve.row_points().items():
        assert [n for n, _ in points] == list(row_probe_sizes(rows, 32, 4, ragged=False))
        for n, t in points:
            assert t == pytest.approx(_truth_ms(rows, n, 1.5) / 1e3)
    assert curve.pass_seconds(8, 16) > 3 * curve.seconds(16)


def test_served_passes_correct_each_row_count_and_ignore_an_outlier():
    base = StepTimeModel(ONE_ROW, rows={8: [(8, 0.010), (16, 0.020), (32, 0.040)]})
    served = ServedSteps()
    for seconds in (0.0137, 0.0138, 0.140, 0.0136):  # one pass beside a neighbour's burst
        served.add(8, seconds, rows=8)
    for seconds in (0.0051, 0.0052):
        served.add(1, seconds)
    for seconds in (0.012, 0.0121):
        served.add(5, seconds, rows=5)  # a row count the probe never timed
    curve = served.corrected(base)
    assert curve.pass_seconds(8, 8) == pytest.approx(0.0137, rel=0.01)  # the median, not the outlier or the probe
    # 8 rows at 16 and 32 tokens were never served: scaled by how 8 rows of one token compared (1.37x)
    assert curve.pass_seconds(8, 16) == pytest.approx(0.020 * 1.37, rel=0.02)
    assert curve.pass_seconds(1, 1) == pytest.approx(0.0051, rel=0.01)  # one row kept its own measure
    assert curve.pass_seconds(5, 5) == pytest.approx(0.0121, rel=0.01) and 5 in curve.row_points()


def test_beyond_the_served_sizes_the_correction_follows_the_served_slope():
    """A probe that priced each draft token on 8 rows at 2.1 ms where it costs 0.6: served passes at 8 and 16 tokens
    give the line, and 32 tokens is priced on it (a ratio from 16 tokens alone would leave it 37% too dear). A
    served slope far steeper than the probe's is taken at most MAX_SLOPE_RATIO times the probe's."""
    base = StepTimeModel(ONE_ROW, rows={8: [(8, 0.013), (16, 0.030), (32, 0.064)]})
    served = ServedSteps()
    for _ in range(3):
        served.add(8, 0.013, rows=8)
        served.add(16, 0.018, rows=8)
    assert served.corrected(base).pass_seconds(8, 32) == pytest.approx(0.018 + 0.034 * 5 / 17, rel=1e-6)
    steep = ServedSteps()
    for _ in range(3):
        steep.add(8, 0.013, rows=8)
        steep.add(16, 0.130, rows=8)  # 7x the probe's slope
    limit = step_timing.MAX_SLOPE_RATIO
    assert steep.corrected(base).pass_seconds(8, 32) == pytest.approx(0.130 + 0.034 * limit, rel=1e-6)


def test_the_attention_price_takes_the_median_pair_and_at_most_doubles_a_pass(monkeypatch):
    """The per-key price is never corrected by served passes, so one burst must not set it: passes after none and
    after CONTEXT_PROBE positions are timed in pairs and the median difference kept, at most the pass's own time."""

    def scripted(passes):
        script = iter(passes)

        def timed(target, cache, n, start, layers, rows=1):
            expected_start, seconds = next(script)
            assert (n, start) == (8, expected_start)
            return seconds

        return timed

    target, context = SimpleNamespace(multi_token_rows_serial=False), step_timing.CONTEXT_PROBE
    burst = [(0, 0.010), (context, 0.012), (0, 0.010), (context, 0.200), (0, 0.010), (context, 0.0125)]
    monkeypatch.setattr(step_timing, "_timed_pass", scripted(burst))
    price = step_timing._attention_per_key_query(target, None, {1: 0.005, 8: 0.010}, (), 2048)
    assert price == pytest.approx(0.0025 / (8 * context))  # the median of 2, 190 and 2.5 ms
    monkeypatch.setattr(step_timing, "_timed_pass", scripted([(0, 0.010), (context, 0.100)] * 3))
    price = step_timing._attention_per_key_query(target, None, {1: 0.005, 8: 0.010}, (), 2048)
    assert price == pytest.approx(0.010 / (8 * context))  # a context at most doubles the 8-token pass


def test_the_cache_file_keeps_the_curves_by_rows(tmp_path):
    cache = StepCurveCache(tmp_path / "c.json", {"target": "t"})
    cache.save(StepTimeModel(ONE_ROW, rows={8: EIGHT_ROWS}))
    loaded = cache.load(False)
    assert loaded is not None and loaded.pass_seconds(8, 9) == pytest.approx(0.0162)
    assert loaded.pass_seconds(8, 12) == pytest.approx(0.0194) and loaded.seconds(9) == pytest.approx(0.0094)


def _drafted(engine: SpecEngine, target) -> int:
    prompts = [target.encode(f"Tell me about fox number {i}. ") for i in range(20)]
    results = engine.generate(prompts, SamplingParams(max_tokens=128, ignore_eos=True))
    return sum(r.num_draft_tokens for r in results)


def _start(fake_clock, probe_per_draft: float, learn_online: bool = True) -> tuple[SpecEngine, RowClockedStub]:
    """An engine at 8 rows whose probe saw `probe_per_draft` ms a draft token on several rows; 0.5 ms after it."""
    target = RowClockedStub(fake_clock, per_draft=probe_per_draft)
    engine = SpecEngine(
        target,
        StubDrafter(),
        max_batch_size=8,
        max_seq_len=512,
        num_speculative_tokens=4,
        planner=BudgetPlanner(learn_online=learn_online),
    )
    target.per_draft = 0.5
    return engine, target


def test_two_starts_at_8_rows_draft_alike_though_one_probe_was_disturbed(fake_clock):
    """Item 0 at a batch of 8: a start whose probe ran beside a busy neighbour (a draft token on several rows 2 ms
    instead of 0.5: drafting looks a loss) drafts within 10% of a quiet start once the passes it serves have corrected
    the curves by rows. Negative control: the same disturbed start without learning drafts nothing."""
    quiet, target = _start(fake_clock, 0.5)
    baseline = _drafted(quiet, target)
    disturbed, target = _start(fake_clock, 2.0)
    assert baseline > 0 and abs(_drafted(disturbed, target) - baseline) <= 0.1 * baseline
    frozen, target = _start(fake_clock, 2.0, learn_online=False)
    assert _drafted(frozen, target) < 0.5 * baseline
