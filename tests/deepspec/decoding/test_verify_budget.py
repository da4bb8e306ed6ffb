"""The throughput-aware verification budget: the step-time fit, the depth choice on hand-computed cases, and the
engine verifying only as deep as the model says pays — with output still identical to target-only."""

from __future__ import annotations

import pytest
import torch

from deepspec.decoding.drafter import Drafter
from deepspec.decoding.drafters.neural import NeuralDrafter
from deepspec.decoding.engine import SpecEngine
from deepspec.decoding.params import SamplingParams
from deepspec.decoding.planner import BudgetPlanner
from deepspec.decoding.registry import load_checkpoint_drafter
from deepspec.decoding.tree import monotone_survival
from deepspec.decoding.verify_budget import (
    AcceptanceHistory,
    DraftTimeModel,
    StepTimeModel,
    best_depth,
    best_nodes,
    modelled_tokens_per_second,
    observed_survival,
)
from deepspec.models.drafts import save_draft
from tests.training.helpers import tiny_draft, tiny_target


def _model(intercept_ms: float, slope_ms: float) -> StepTimeModel:
    return StepTimeModel([(1, (intercept_ms + slope_ms) / 1e3), (9, (intercept_ms + 9 * slope_ms) / 1e3)])


def test_step_time_model_interpolates_the_probes_and_needs_two_sizes():
    # a knee at 8 tokens (4-bit kernel below, dense above), a noisy 4-token probe, and 2 runs at 16 tokens
    m = StepTimeModel([(1, 0.010), (4, 0.009), (8, 0.020), (16, 0.024), (16, 0.023), (32, 0.031)])
    assert m.predict(1) == pytest.approx(0.010) and m.predict(0) == pytest.approx(0.010)  # flat below the probes
    assert m.predict(4) == pytest.approx(0.010)  # never cheaper than a narrower pass
    assert m.predict(6) == pytest.approx(0.015)  # halfway between 4 (10 ms) and 8 (20 ms)
    assert m.predict(16) == pytest.approx(0.023)  # the fastest of repeated probes
    assert m.predict(48) == pytest.approx(0.031 + 16 * 0.008 / 16)  # the last segment's slope carries on
    torch.testing.assert_close(m.predict(torch.tensor([6, 16])), torch.tensor([0.015, 0.023], dtype=torch.float64))
    with pytest.raises(ValueError, match="two or more"):
        StepTimeModel([(4, 0.01), (4, 0.02)])


def test_best_depth_trades_expected_tokens_against_step_time():
    survival = torch.tensor([[0.9, 0.8, 0.1, 0.05]])
    # 30 ms + 1 ms/token: (1+Σs)/t = 1/31, 1.9/32, 2.7/33, 2.8/34, 2.85/35 → depth 3
    assert best_depth(survival, _model(30, 1)) == 3
    # 30 ms + 10 ms/token: 1/40, 1.9/50, 2.7/60, 2.8/70 → depth 2
    assert best_depth(survival, _model(30, 10)) == 2
    # rows share the depth (they are padded to it): a second row with nothing to verify doubles what depth costs
    # 2/50, 2.9/70, 3.7/90 → depth 1; and with a cheaper fixed cost 2/30, 2.9/50 → depth 0
    assert best_depth(torch.cat([survival, torch.zeros(1, 4)]), _model(30, 10)) == 1
    assert best_depth(torch.cat([survival, torch.zeros(1, 4)]), _model(10, 10)) == 0
    assert best_depth(torch.ones(2, 7), _model(30, 0)) == 7


def test_a_target_that_runs_drafted_rows_one_by_one_prices_each_row_as_its_own_pass():
    """ONNX Runtime verifies B rows of d + 1 tokens as B passes (OnnxTarget.multi_token_rows_serial): on a flat
    curve, 8 well-drafted rows pay in one pass (the default), but not in 8 passes against one batched decode step."""
    flat = [(1, 0.010), (64, 0.010)]
    survival = torch.full((8, 7), 0.6).cumprod(1)  # Σ over the 7 slots ≈ 1.4 tokens won per row
    assert best_depth(survival, StepTimeModel(flat)) == 7
    serial = StepTimeModel(flat, rows_serial=True)
    assert best_depth(survival, serial) == 0  # 8 passes for 8 x 2.4 tokens < 1 pass for 8 tokens
    assert best_depth(survival[:1], serial) == 7  # one row: one pass either way
    torch.testing.assert_close(
        serial.round_seconds(8, torch.tensor([0, 3])), torch.tensor([0.010, 0.080], dtype=torch.float64)
    )


def test_best_nodes_keeps_each_rows_likeliest_ancestor_closed_nodes():
    # nodes 0, 1 follow the root, 2 follows 0, 3 follows 2, 4 follows 1
    parents, num = torch.tensor([[-1, -1, 0, 2, 1]]), torch.tensor([5])
    survival = monotone_survival(torch.tensor([[0.9, 0.5, 0.85, 0.4, 0.1]]), parents, num)
    # 30 ms + 10 ms/token, sorted survival 0.9, 0.85, 0.5, 0.4, 0.1: (1+Σ)/t = 1/40, 1.9/50, 2.75/60, 3.25/70,
    # 3.65/80, 3.75/90 → 3 nodes: 0, 2 (the likelier path) and 1
    assert best_nodes(survival, _model(30, 10)).tolist() == [[True, True, True, False, False]]
    assert best_nodes(survival, _model(1, 0)).all()  # free tokens: the whole tree
    assert not best_nodes(survival, _model(1, 1000)).any()  # costly ones: none, the root alone is verified
    # a parent and its child of equal survival: the parent is kept first, so the kept set stays a tree
    # (the step time jumps after 3 tokens: 2 nodes pay, 3 do not)
    knee = StepTimeModel([(1, 0.010), (3, 0.010), (4, 0.040)])
    tie = torch.tensor([[0.5, 0.5, 0.6, 0.05]])
    tie = monotone_survival(tie, torch.tensor([[-1, 0, -1, 2]]), torch.tensor([4]))
    assert best_nodes(tie, knee).tolist() == [[True, False, True, False]]


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def _dspark_engine(target, tmp_path, **kw) -> SpecEngine:
    path = save_draft(tiny_draft(target, "dspark", draft_vocab_size=48), tmp_path / "d")
    drafter = load_checkpoint_drafter(path, target, confidence_threshold=0.0)
    assert isinstance(drafter, NeuralDrafter)
    with torch.no_grad():  # c = σ(0) = 0.5 on every slot: survival 0.5, 0.25, ...
        drafter.model.confidence.weight.zero_()
        drafter.model.confidence.bias.zero_()
    return SpecEngine(
        target, drafter, max_batch_size=2, max_seq_len=128, num_speculative_tokens=4, planner=BudgetPlanner(**kw)
    )


def test_engine_verifies_only_as_deep_as_pays(target, tmp_path):
    prompts, params = [[1, 2, 3], [4, 5, 6, 7]], SamplingParams(max_tokens=12, ignore_eos=True)
    reference = SpecEngine(target, None, max_batch_size=2, max_seq_len=128).generate(prompts, params)

    engine = _dspark_engine(target, tmp_path)
    assert engine.planner.step_time is not None and engine.planner.step_time.predict(1) > 0  # probed at start
    assert engine.planner.draft_time is not None and float(engine.planner.draft_time.round_seconds(1, [4])[0]) > 0
    engine.planner.draft_time = None  # drafting itself free: the verify pass's price alone decides
    engine.planner.step_time = _model(1, 0)  # extra tokens are free: verify every draft
    free = engine.generate(prompts, params)
    engine.planner.step_time = _model(1, 1000)  # cost ∝ tokens: a slot surviving with p < 1 never pays
    costly = engine.generate(prompts, params)

    assert [r.token_ids for r in free] == [r.token_ids for r in reference]
    assert [r.token_ids for r in costly] == [r.token_ids for r in reference]
    assert all(r.num_draft_tokens >= r.num_steps for r in free)  # ≥ 1 draft every round
    assert all(r.num_draft_tokens == 0 for r in costly)


def _flat_draft(ms: float) -> DraftTimeModel:
    """A batch-1 draft costing `ms` a drafted round whatever its width."""
    return DraftTimeModel({(1, 1): ms / 1e3, (1, 7): ms / 1e3})


#: int4-like: the cheaper 1-token step, each extra token costs; int8-like: slower alone, nearly flat to 8 tokens
STEEP = {1: 0.005, 2: 0.006, 4: 0.008, 8: 0.015, 16: 0.030, 32: 0.060}
FLAT = {1: 0.006, 2: 0.0062, 4: 0.0065, 8: 0.007, 16: 0.012, 32: 0.022}


def test_a_drafts_own_round_cost_can_turn_the_choice_to_the_cheaper_single_token_step():
    """τ 2 at depth 7. Drafting free, the flat curve wins (its verify passes are nearly free). At 4 ms a drafted
    round, drafting no longer pays on the steep curve, which decodes target-only at 1 / 5 ms (width 0 costs no draft
    time), while on the flat one it still pays but loses: its best, 5 drafts, models 184 tokens/s."""
    free = {name: modelled_tokens_per_second(c, 2.0, 7) for name, c in (("steep", STEEP), ("flat", FLAT))}
    assert free["flat"] > free["steep"] > 200.0
    priced = {
        name: modelled_tokens_per_second(c, 2.0, 7, _flat_draft(4)) for name, c in (("steep", STEEP), ("flat", FLAT))
    }
    assert priced["steep"] == pytest.approx(1 / 0.005)
    assert 1 / 0.006 < priced["flat"] < priced["steep"]
    assert modelled_tokens_per_second(FLAT, 2.0, 7, _flat_draft(0)) == pytest.approx(free["flat"])


def test_the_modelled_throughput_adds_the_draft_round_at_each_width_and_none_at_width_0():
    """α 1/2 (τ 1 + 1/2 + ... + 1/2^7): a round of d drafts commits 2 - 2^-d tokens in t(d + 1) + d ms of drafting;
    a draft costing a second a round leaves the target-only step, 1 / t(1), exactly."""
    flat = {1: 0.010, 8: 0.012}
    tau = sum(0.5**j for j in range(8))
    per_token = DraftTimeModel({(1, 1): 0.001, (1, 7): 0.007})
    want = max((2 - 0.5**d) / (0.010 + 0.002 * d / 7 + 0.001 * d) for d in range(8))
    assert modelled_tokens_per_second(flat, tau, 7, per_token) == pytest.approx(want)
    assert modelled_tokens_per_second(flat, tau, 7, _flat_draft(1000)) == pytest.approx(100.0)
    assert modelled_tokens_per_second(flat, 1.0, 7, _flat_draft(1)) == pytest.approx(100.0)  # τ 1: never drafts


def _recorded_proposals(drafter: Drafter | None) -> list[list[int]]:
    """The slots of each call to the drafter's propose from now on (the call itself goes through)."""
    assert drafter is not None
    calls: list[list[int]] = []
    propose = drafter.propose

    def recorded(view, slots, k, sampling):
        calls.append(slots)
        return propose(view, slots, k, sampling)

    drafter.propose = recorded
    return calls


@pytest.mark.parametrize("kind", ["prompt-lookup", "eagle3"])  # a drafter reading the view, one with a KV cache
def test_a_batch_where_no_depth_can_pay_skips_drafting_and_stays_target_only(target, tmp_path, kind):
    """B rows verified one by one against one batched step: with a curve that rises after 1 token, no depth pays
    at 4 rows even if every draft were accepted, so the drafter is not asked (its drafts would all be dropped);
    the same curve priced as one pass over all rows drafts. A KV drafter still hears every committed token."""
    from deepspec.decoding.registry import build_drafter

    prompts, params = [[1, 2, 3, 1, 2, 3]] * 4, SamplingParams(max_tokens=10, ignore_eos=True)
    reference = SpecEngine(target, None, max_batch_size=4, max_seq_len=64).generate(prompts, params)
    curve = [(1, 0.010), (2, 0.025), (3, 0.027), (4, 0.028)]  # serial d = 2: 3/27 < 4 rows in 28 ms
    if kind != "prompt-lookup":
        kind = str(save_draft(tiny_draft(target, kind, draft_vocab_size=48), tmp_path / kind))
    for serial, asked in ((True, False), (False, True)):
        drafter = build_drafter(kind, target)
        calls = _recorded_proposals(drafter)
        engine = SpecEngine(
            target,
            drafter,
            max_batch_size=4,
            max_seq_len=64,
            num_speculative_tokens=2,
            planner=BudgetPlanner(StepTimeModel(curve, rows_serial=serial), price_drafting=False),
        )
        got = engine.generate(prompts, params)
        assert [r.token_ids for r in got] == [r.token_ids for r in reference]
        assert bool(calls) == asked


def test_draft_time_model_interpolates_rows_then_widths_and_is_zero_without_drafts():
    ms = 1e-3
    # rows 1 and 4, widths 1 and 4; a noisy probe (4 rows, 1 draft cheaper than 1 row) is lifted to the 1-row one
    m = DraftTimeModel({(1, 1): 1 * ms, (1, 4): 4 * ms, (4, 1): 0.5 * ms, (4, 4): 10 * ms})
    torch.testing.assert_close(
        m.round_seconds(1, [0, 1, 2, 4, 8]) / ms, torch.tensor([0, 1, 2, 4, 8], dtype=torch.float64)
    )  # linear past the last width
    torch.testing.assert_close(m.round_seconds(2, [1, 4]) / ms, torch.tensor([1, 6], dtype=torch.float64))
    torch.testing.assert_close(m.round_seconds(8, [4]) / ms, torch.tensor([10], dtype=torch.float64))  # flat past 4
    with pytest.raises(ValueError, match="every probed width for every probed row count"):
        DraftTimeModel({(1, 1): ms, (1, 4): ms, (4, 1): ms})
    one = DraftTimeModel({(1, 1): 2 * ms, (4, 1): 3 * ms})  # a draft of depth 1 probes one width
    torch.testing.assert_close(
        one.round_seconds(2, [0, 1, 3]) / ms, torch.tensor([0, 7 / 3, 7 / 3], dtype=torch.float64)
    )
    assert m.by_width(1) == pytest.approx({1: 1 * ms, 4: 4 * ms})  # what a choice records


def test_a_costly_draft_drafts_only_as_deep_as_its_own_time_pays():
    """Survival 0.6, 0.36, 0.216 on a flat 6 ms verify pass: free drafting verifies all 3; at 3 ms a draft token,
    1 draft gives 1.6 / 9 ms (0.178) against 1 / 6 ms target-only (0.167) and 2 drafts 1.96 / 12 ms (0.163);
    at 5 ms a draft token not even one pays (1.6 / 11 ms)."""
    survival, flat = torch.tensor([[0.6, 0.36, 0.216]]), _model(6, 0)

    def per_token(ms: float):
        """A draft costing `ms` milliseconds a token, priced for rounds of 0..3 tokens at one row."""
        return DraftTimeModel({(1, 1): ms / 1e3, (1, 2): 2 * ms / 1e3}).round_seconds(1, range(4))

    assert best_depth(survival, flat) == 3
    assert best_depth(survival, flat, per_token(3)) == 1
    assert best_depth(survival, flat, per_token(5)) == 0


@pytest.mark.parametrize("kind", ["prompt-lookup", "eagle3"])
def test_a_draft_slower_than_what_it_wins_is_not_run_and_output_stays_target_only(target, tmp_path, kind):
    """A neural draft priced at a second per draft token is never asked and the engine decodes target-only (its KV
    cache still hears every commit); priced free it is asked. Prompt lookup runs no model of its own, so its
    probed time is not what decides (`Drafter.costly_rows`). Greedy output identical either way."""
    from deepspec.decoding.registry import build_drafter

    prompts, params = [[1, 2, 3, 1, 2, 3]] * 2, SamplingParams(max_tokens=10, ignore_eos=True)
    reference = SpecEngine(target, None, max_batch_size=2, max_seq_len=64).generate(prompts, params)
    if kind != "prompt-lookup":
        kind = str(save_draft(tiny_draft(target, kind, draft_vocab_size=48), tmp_path / kind))
    for seconds in (1.0, 0.0):
        asked = seconds == 0 or kind == "prompt-lookup"
        drafter = build_drafter(kind, target)
        engine = SpecEngine(
            target, drafter, max_batch_size=2, max_seq_len=64, num_speculative_tokens=2, planner=BudgetPlanner()
        )
        assert (engine.planner.draft_time is None) == (kind == "prompt-lookup")  # probed at start where it runs a model
        assert engine.batch_state.view.live_sequence_ids() == set()  # the probe's slots released
        engine.planner.step_time = _model(1, 0)
        engine.planner.draft_time = DraftTimeModel({(r, w): seconds * w for r in (1, 2) for w in (1, 2)})
        calls = _recorded_proposals(drafter)
        got = engine.generate(prompts, params)
        assert [r.token_ids for r in got] == [r.token_ids for r in reference]
        assert bool(calls) == asked and (asked or sum(r.num_draft_tokens for r in got) == 0)
    unpriced = SpecEngine(
        target,
        build_drafter(kind, target),
        max_batch_size=2,
        max_seq_len=64,
        num_speculative_tokens=2,
        planner=BudgetPlanner(price_drafting=False),
    )
    assert (
        unpriced.planner.step_time is not None and unpriced.planner.draft_time is None
    )  # verify passes budgeted, drafting free


def test_the_verify_pass_is_timed_once_per_target_and_shape(monkeypatch):
    import deepspec.decoding.step_timing as step_timing
    from deepspec.decoding.registry import build_drafter

    timed = []
    time_pass = step_timing._timed_pass
    monkeypatch.setattr(
        step_timing,
        "_timed_pass",
        lambda target, cache, n, start, layers, rows=1: (
            timed.append((n, start)) or time_pass(target, cache, n, start, layers, rows)
        ),
    )
    target = tiny_target()  # a fresh target: nothing measured on it yet
    engines = [
        SpecEngine(
            target,
            build_drafter("prompt-lookup", target),
            max_batch_size=1,
            max_seq_len=64,
            max_verify_tokens=m,
            planner=BudgetPlanner(),
        )
        for m in (32, 32, 8)
    ]
    assert engines[0].planner.step_time is engines[1].planner.step_time is not engines[2].planner.step_time
    probes = [n for n, start in timed if start == 0]  # a warm-up pass, then PROBE_ROUNDS rounds over the sizes
    assert (
        probes == [32] + [1, 2, 4, 8, 16, 32] * step_timing.PROBE_ROUNDS + [8] + [1, 2, 4, 8] * step_timing.PROBE_ROUNDS
    )


def test_budget_can_be_switched_off_and_covers_drafters_without_estimates(target):
    from deepspec.decoding.registry import build_drafter

    pl = SpecEngine(
        target, build_drafter("prompt-lookup", target), max_batch_size=1, max_seq_len=64, planner=BudgetPlanner()
    )
    assert pl.planner.step_time is not None
    off = SpecEngine(target, build_drafter("prompt-lookup", target), max_batch_size=1, max_seq_len=64)
    assert off.planner.step_time is None
    assert SpecEngine(target, None, max_batch_size=1, max_seq_len=64, planner=BudgetPlanner()).planner.step_time is None


def test_observed_survival_starts_at_the_prior_and_follows_the_record():
    fresh = observed_survival([([], [])], 3)
    assert fresh == [pytest.approx([0.7, 0.49, 0.343])]
    # 16 rounds proposing 2 slots: slot 0 accepted 12 times, slot 1 never: slot 0 (12 + 4·0.7) / 20; slot 1 was
    # reached in the 12 rounds slot 0 was accepted, so its rate is (0 + 4·0.7) / 16; slot 2, never drafted, decays
    # by the prior from there
    record = observed_survival([([16, 16], [12, 0])], 3)
    assert record[0] == pytest.approx([0.74, 0.74 * 0.175, 0.74 * 0.175 * 0.7])
    # slots 0 and 1 each accepted in 1 of 40 rounds: slot 1's one measurement does not make slots 2.. look as good
    poor = observed_survival([([40, 40], [1, 1])], 7)[0]
    assert poor[0] == pytest.approx(3.8 / 44) and poor[1] == pytest.approx(poor[0] * 3.8 / 5)
    assert [b / a for a, b in zip(poor[1:-1], poor[2:])] == pytest.approx([0.7] * 5)


def test_prompt_lookup_stops_drafting_where_its_record_says_it_does_not_pay(target):
    """Costly extra tokens: prompt lookup's optimistic prior gives way to its record and the engine verifies
    nothing more, with output still identical to target-only."""
    from deepspec.decoding.registry import build_drafter

    prompts, params = [[1, 2, 3, 1, 2, 3, 1, 2]], SamplingParams(max_tokens=24, ignore_eos=True)
    reference = SpecEngine(target, None, max_batch_size=1, max_seq_len=128).generate(prompts, params)
    engine = SpecEngine(
        target, build_drafter("prompt-lookup", target), max_batch_size=1, max_seq_len=128, planner=BudgetPlanner()
    )
    engine.planner.step_time = _model(1, 1000)
    costly = engine.generate(prompts, params)
    engine.planner.step_time = _model(1, 0)
    free = engine.generate(prompts, params)
    assert [r.token_ids for r in costly] == [r.token_ids for r in free] == [r.token_ids for r in reference]
    assert costly[0].num_draft_tokens == 0 and free[0].num_draft_tokens > 0


class _OverconfidentLookup(Drafter):
    """Deterministic drafts (no q) the target never accepts, each claimed to survive with 0.9: what a greedy-measured
    acceptance table says where a sampled row accepts a draft only with the target's probability of it."""

    name, feature_layers = "overconfident", ()

    def bind(self, target, max_batch_size, max_seq_len):
        pass

    def propose(self, view, slots, k, sampling):
        from deepspec.decoding.drafter import Proposal

        B = len(slots)
        tokens = torch.tensor([[(view.last_token(s) + 7) % 16] * k for s in slots])
        return Proposal.from_rows(tokens, torch.full((B,), k), None, torch.full((B, k), 0.9).cumprod(1))


def test_a_drafters_estimates_give_way_to_what_each_sequence_accepts(target):
    """Sampled rows: the drafter's 0.9 gives way to the row's record of rejections and the row stops drafting;
    greedy rows scale the drafter's table by how far it held for them (EstimateCalibration), and stop too."""
    from deepspec.decoding.drafter import Drafter

    Drafter.register(_OverconfidentLookup)
    prompts = [[1, 2, 3, 4]]
    engine = SpecEngine(
        target,
        _OverconfidentLookup(),
        max_batch_size=1,
        max_seq_len=128,
        num_speculative_tokens=4,
        planner=BudgetPlanner(),
    )
    engine.planner.step_time = _model(1, 0.2)  # an extra verify token costs a fifth of a pass: pays only above ~0.2
    sampled = engine.generate(prompts, SamplingParams(max_tokens=40, temperature=1.0, seed=3, ignore_eos=True))[0]
    greedy = engine.generate(prompts, SamplingParams(max_tokens=40, ignore_eos=True))[0]
    assert greedy.num_accepted_tokens == 0 and greedy.num_drafted_steps <= greedy.num_steps // 3
    assert sampled.num_accepted_tokens <= sampled.num_draft_tokens // 4
    # trusting the table it would draft 4 tokens in each of its ~39 rounds; its record stops it within a third
    assert sampled.num_drafted_steps <= sampled.num_steps // 3 and sampled.num_draft_tokens <= 40


def test_the_calibration_is_accepted_over_estimated_and_starts_from_the_history():
    from deepspec.decoding.verify_budget import (
        CALIBRATION_WEIGHT,
        EXPLORE_EVERY,
        AcceptanceHistory,
        EstimateCalibration,
    )

    calibration = EstimateCalibration()
    assert calibration.factor() == 1.0
    calibration.settle(3)  # a round nothing was expected of: not counted
    assert calibration.factor() == 1.0
    for _ in range(20):
        calibration.expect(2.0)
        calibration.settle(1)
    assert calibration.factor() == pytest.approx((20 + CALIBRATION_WEIGHT) / (40 + CALIBRATION_WEIGHT))
    history = AcceptanceHistory()
    history.add(True, [1], [1], calibration)
    history.add(False, [1], [1], EstimateCalibration())  # sampled: not kept
    assert history.calibration(1).prior == pytest.approx(calibration.factor())
    assert history.calibration(EXPLORE_EVERY).prior == 1.0  # one sequence in EXPLORE_EVERY trusts the drafter
    fresh = history.calibration(1)
    assert fresh.factor() == pytest.approx(calibration.factor())
    assert fresh.factor(from_history=False) == 1.0  # beside a sampled row: not what the engine served before


def test_a_sampled_row_starts_from_the_lower_sampled_prior():
    from deepspec.decoding.verify_budget import PRIOR_SAMPLED_SLOT_SURVIVAL, PRIOR_SLOT_SURVIVAL, AcceptanceHistory

    history = AcceptanceHistory()
    history.add(True, [10, 10], [10, 10])  # a history that says every draft is accepted
    assert history.prior(False, 2, 1, sampled=True) == [PRIOR_SAMPLED_SLOT_SURVIVAL] * 2
    assert history.prior(False, 2, 1) == [PRIOR_SLOT_SURVIVAL] * 2  # a greedy row in a mixed batch
    assert history.prior(True, 2, 1)[0] > PRIOR_SLOT_SURVIVAL


def test_the_engines_history_is_the_prior_of_its_next_sequences():
    """Finished greedy sequences' records become the prior a new greedy sequence's own record starts from, each
    slot's history rate shrunk to the fixed prior; one sequence in EXPLORE_EVERY, and every sampled one (its draws
    follow its depths: a seeded request must not depend on earlier traffic), starts from the fixed prior."""
    from deepspec.decoding.verify_budget import EXPLORE_EVERY, PRIOR_ROUNDS, PRIOR_SLOT_SURVIVAL

    fixed = [PRIOR_SLOT_SURVIVAL] * 3
    history = AcceptanceHistory()
    assert history.prior(True, 3, sequence_id=1) == fixed
    history.add(True, [60, 60], [6, 0])  # slot 0 accepted in 6 of 60 rounds, slot 1 never
    history.add(True, [40], [4])  # summed: slot 0 in 10 of 100, so slot 1 reached at most 10 times
    prior = history.prior(True, 3, sequence_id=1)
    shrink = PRIOR_ROUNDS * PRIOR_SLOT_SURVIVAL
    assert prior[0] == pytest.approx((10 + shrink) / (100 + PRIOR_ROUNDS))
    assert prior[1] == pytest.approx(shrink / (10 + PRIOR_ROUNDS)) and prior[2] == pytest.approx(PRIOR_SLOT_SURVIVAL)
    history.add(False, [50], [0])  # a sampled sequence's record is not kept
    assert history.prior(True, 3, sequence_id=1) == prior
    assert history.prior(False, 3, sequence_id=1) == fixed
    assert history.prior(True, 3, sequence_id=5 * EXPLORE_EVERY) == fixed
    fresh = observed_survival([([], [])], 3, [prior])
    assert fresh[0] == pytest.approx([prior[0], prior[0] * prior[1], prior[0] * prior[1] * prior[2]])


class _NeverAccepted(Drafter):
    """Deterministic drafts without estimates (the budget reads each row's record) that the target never accepts."""

    name, feature_layers = "never-accepted", ()

    def bind(self, target, max_batch_size, max_seq_len):
        pass

    def propose(self, view, slots, k, sampling):
        from deepspec.decoding.drafter import Proposal

        tokens = torch.tensor([[(view.last_token(s) + 7) % 16] * k for s in slots])
        return Proposal.from_rows(tokens, torch.full((len(slots),), k), None, None)


def test_a_draft_the_first_sequence_found_useless_is_not_drafted_for_the_next(target, monkeypatch):
    """The first sequence starts from the optimistic prior, drafts, and its record stops it; the next sequences
    start from that record and draft nothing (the fixed prior alone made each of them draft again); greedy output
    identical to target-only throughout."""
    import deepspec.decoding.verify_budget as verify_budget
    from deepspec.decoding.drafter import Drafter

    monkeypatch.setattr(verify_budget, "EXPLORE_EVERY", 1 << 40)  # no exploring sequence among these
    Drafter.register(_NeverAccepted)
    prompts, params = [[1, 2, 3, 4]], SamplingParams(max_tokens=24, ignore_eos=True)
    reference = SpecEngine(target, None, max_batch_size=1, max_seq_len=128).generate(prompts, params)[0]
    engine = SpecEngine(
        target, _NeverAccepted(), max_batch_size=1, max_seq_len=128, num_speculative_tokens=2, planner=BudgetPlanner()
    )
    engine.planner.step_time = _model(1, 0.5)  # an extra verify token costs half a pass: depth 1 pays above 0.5
    first, second, third = (engine.generate(prompts, params)[0] for _ in range(3))
    assert first.token_ids == second.token_ids == third.token_ids == reference.token_ids
    assert first.num_draft_tokens > 0 and first.num_accepted_tokens == 0
    assert second.num_draft_tokens == third.num_draft_tokens == 0
    engine.forget_acceptance()  # forgotten (as after a warm-up): the fixed prior drafts again
    assert engine.generate(prompts, params)[0].num_draft_tokens > 0


def test_the_acceptance_ops_own_cost_is_priced_with_every_drafted_depth(target, tmp_path):
    """`_verify_overhead`: probed per sampling mode at start (>= 0), added to each depth > 0; where it exceeds
    what any depth wins, the engine decodes target-only, and the output stays the target's."""
    prompts, params = [[1, 2, 3], [4, 5, 6, 7]], SamplingParams(max_tokens=12, ignore_eos=True)
    reference = SpecEngine(target, None, max_batch_size=2, max_seq_len=128).generate(prompts, params)
    engine = _dspark_engine(target, tmp_path)
    planner = engine.planner
    assert isinstance(planner, BudgetPlanner) and planner.verify_overhead is not None
    assert set(planner.verify_overhead) == {False, True} and min(planner.verify_overhead.values()) >= 0
    planner.draft_time = None
    planner.step_time = _model(1, 0)  # extra verify tokens free: only the op's overhead can stop drafting
    planner.verify_overhead = {False: 0.0, True: 0.0}
    free = engine.generate(prompts, params)
    planner.verify_overhead = {False: 10.0, True: 0.0}  # a drafted round's op costs 10 s more than a plain one
    costly = engine.generate(prompts, params)
    assert all(r.num_draft_tokens >= r.num_steps for r in free)
    assert all(r.num_draft_tokens == 0 for r in costly)
    assert [r.token_ids for r in costly] == [r.token_ids for r in free] == [r.token_ids for r in reference]
