"""Ragged verify passes (Target.ragged_rows): each row of a round verifies its own depth instead of every row being
padded to the deepest one, and the budget picks each row's depth by ranking draft slots across the batch
(verify_budget.best_row_depths). Greedy output stays the target's own; a steep step curve drafts the confident row
alone where the padded budget could not afford to draft at all."""

from __future__ import annotations

import pytest
import torch

from deepspec.decoding import SamplingParams, SpecEngine
from deepspec.decoding.drafter import PaddedProposal
from deepspec.decoding.drafters.prompt_lookup import PromptLookupDrafter
from deepspec.decoding.planner import BudgetPlanner
from deepspec.decoding.verify_budget import StepTimeModel, best_depth, best_row_depths
from tests.conftest import make_tiny_target
from tests.deepspec.decoding.planner_rows import greedy_rows

#: prompts whose repeats give prompt lookup long matches in some rows and none in others
PROMPTS = [[1, 2, 3, 1, 2], [4, 5, 6, 7, 8, 9, 10, 4, 5], [3], [7, 7, 7, 7, 7, 7], [2, 11, 2, 11, 2], [9, 8, 7]]
#: a compute-bound step: every token of a pass costs what the first one does beyond a fixed 1 ms
STEEP = StepTimeModel([(1, 2e-3), (8, 9e-3), (64, 65e-3)])


class RaggedTarget:
    """The tiny target as a target that verifies ragged rows: it scores what it is given and returns zeros past
    each row's length, as the native decoder does, recording the lengths each pass was asked for."""

    ragged_rows = True

    def __init__(self, inner):
        self._inner = inner
        self.lengths_seen: list[list[int]] = []

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def forward(self, tokens, start, cache=None, *, row_lengths=None, **options):
        out = self._inner.forward(tokens, start, cache, **options)
        if row_lengths is not None:
            self.lengths_seen.append(row_lengths.tolist())
            past = torch.arange(tokens.shape[1])[None, :] >= row_lengths[:, None]
            if out.logits is not None:
                out.logits[past] = 0.0
        return out


@pytest.fixture(scope="module")
def target():
    return make_tiny_target(eos=False, temperature=4.0)[0]


def _run(target, planner=None, max_batch_size: int = 8) -> list[list[int]]:
    engine = SpecEngine(
        target,
        PromptLookupDrafter(min_ngram=1, max_ngram=3),
        max_batch_size=max_batch_size,
        max_seq_len=128,
        num_speculative_tokens=4,
        planner=planner,
    )
    return [r.token_ids for r in engine.generate(PROMPTS, SamplingParams(max_tokens=24))]


@pytest.mark.parametrize("batch", [3, 8])
def test_rows_verifying_their_own_depths_give_the_target_only_output(target, batch):
    reference = [
        r.token_ids
        for r in SpecEngine(target, None, max_batch_size=1, max_seq_len=128).generate(
            PROMPTS, SamplingParams(max_tokens=24)
        )
    ]
    ragged = RaggedTarget(target)
    assert _run(ragged, max_batch_size=batch) == reference
    assert any(len(set(lengths)) > 1 for lengths in ragged.lengths_seen)  # rows really verified different depths


def test_the_budget_on_a_ragged_target_keeps_the_output(target):
    reference = _run(target)
    ragged = RaggedTarget(target)
    assert _run(ragged, planner=BudgetPlanner(STEEP, learn_online=False, per_row_depths=True)) == reference


def test_slots_are_ranked_across_the_batch():
    """One confident row among unsure ones: the padded budget would verify 4 rows x (d + 1) and finds no depth that
    pays on a steep curve; ranked per row, the confident row drafts alone."""
    survival = [[0.95, 0.9, 0.85, 0.8], [0.1, 0.01, 0.0, 0.0], [0.05, 0.0, 0.0, 0.0], [0.2, 0.04, 0.0, 0.0]]

    def seconds(depths):
        return STEEP.seconds(sum(depths) + len(depths))

    assert best_depth(survival, STEEP) == 0
    # 4 tokens 5 ms (0.8 a ms); + 0.95, 0.9, 0.85 in 6, 7, 8 ms (0.825, 0.836, 0.8375); the fourth slot, 0.833, loses
    assert best_row_depths(survival, seconds) == [3, 0, 0, 0]


def test_a_flat_curve_drafts_every_slot_that_may_survive_and_ties_stay_shallow():
    flat = StepTimeModel([(1, 5e-3), (64, 5e-3)])

    def seconds(depths):
        return flat.seconds(sum(depths) + len(depths))

    assert best_row_depths([[0.5, 0.2, 0.0], [0.9, 0.0, 0.0]], seconds) == [2, 1]
    assert best_row_depths([[0.0, 0.0]], seconds) == [0]  # nothing can survive: nothing verified
    # a row whose later slot reads higher than an earlier one still drafts in order (survival is held non-increasing)
    assert best_row_depths([[0.1, 0.9]], lambda depths: 1.0 + 0.5 * sum(depths)) == [0]


def test_the_budget_gives_each_row_its_own_depth():
    planner = BudgetPlanner(learn_online=False, per_row_depths=True)
    planner.step_time = StepTimeModel([(1, 4e-3), (64, 67e-3)])  # 3 ms + 1 ms a token
    survival = torch.tensor([[0.95, 0.9, 0.85, 0.8], [0.1, 0.01, 0.0, 0.0], [0.05, 0.0, 0.0, 0.0]])
    proposal = PaddedProposal(torch.ones(3, 4, dtype=torch.long), torch.tensor([4, 2, 1]), survival=survival)
    rows = greedy_rows(3, cache_len=16)
    # several rows: a deterministic draft's estimates are capped by each row's record, here the prior's 0.7 a slot,
    # so row 0's slots are worth 0.7, 0.49, ...: 3 tokens in 6 ms (0.5 a ms); + 0.7 in 7 ms (0.53) pays, + 0.49 in
    # 8 ms (0.524) does not; padded, depth 1 verifies 6 tokens for 0.85 (3.85 in 9 ms: 0.43) and loses
    assert planner.chain_depth(rows, proposal, [4, 2, 1]) == 0
    assert planner.row_depths(rows, proposal, [4, 2, 1]) == [1, 0, 0]
    assert rows[0].calibration._pending == pytest.approx(0.95)  # what row 0's drafter expects of its verified slot


@pytest.mark.parametrize("planner", [None, "budget"])
def test_the_native_decoder_verifies_ragged_rows_with_the_target_only_output(target, planner):
    """The real thing: the native decoder's ragged passes (deepspec/models/native/DESIGN.md, "Ragged rows") under
    the engine, every row's output its own target-only one, and passes that really were ragged."""
    from deepspec.models.native.target import native_target_from

    native = native_target_from(target, num_threads=2, weights="int8")
    reference = _run(native, max_batch_size=1)
    seen: list[list[int]] = []
    forward = native.forward

    def spy(tokens, start, cache=None, *, row_lengths=None, **options):
        if row_lengths is not None:
            seen.append(row_lengths.tolist())
        return forward(tokens, start, cache, row_lengths=row_lengths, **options)

    native.forward = spy  # type: ignore[method-assign]  # a spy on this instance only
    linear = StepTimeModel([(1, 4e-3), (64, 67e-3)])
    budget = BudgetPlanner(linear, learn_online=False, per_row_depths=True) if planner else None
    assert _run(native, planner=budget, max_batch_size=8) == reference
    assert any(len(set(lengths)) > 1 for lengths in seen)


def test_token_trees_of_different_sizes_verify_in_one_ragged_pass_with_the_target_only_output(target):
    """Trees cut to each row's own node budget (BudgetPlanner.keep_tree ranks nodes across the batch) are verified
    as ragged rows: node counts differ per row, outputs stay the target's own."""
    from deepspec.decoding.drafters.random import RandomDrafter
    from deepspec.models.native.target import native_target_from

    native = native_target_from(target, num_threads=2, weights="int8")
    reference = _run(native, max_batch_size=1)
    seen: list[list[int]] = []
    forward = native.forward

    def spy(tokens, start, cache=None, *, row_lengths=None, **options):
        if row_lengths is not None and options.get("tree_parents") is not None:
            seen.append(row_lengths.tolist())
        return forward(tokens, start, cache, row_lengths=row_lengths, **options)

    native.forward = spy  # type: ignore[method-assign]  # a spy on this instance only
    engine = SpecEngine(
        native,
        RandomDrafter(16, seed=1, tree=True),
        max_batch_size=8,
        max_seq_len=128,
        num_speculative_tokens=6,
        planner=BudgetPlanner(StepTimeModel([(1, 4e-3), (64, 67e-3)]), learn_online=False, per_row_depths=True),
    )
    assert [r.token_ids for r in engine.generate(PROMPTS, SamplingParams(max_tokens=24))] == reference
    assert any(len(set(lengths)) > 1 for lengths in seen)


def test_under_load_a_batch_rows_drafts_are_dropped_before_an_interactive_rows():
    """Two rows, the same draft, a curve where one verified slot pays and two do not: the slot goes to the row of the
    more urgent class (SamplingParams.priority, the worker's service class), whichever row it is."""
    rows = greedy_rows(2, cache_len=16)
    survival = torch.tensor([[0.6, 0.0], [0.6, 0.0]])
    proposal = PaddedProposal(torch.ones(2, 2, dtype=torch.long), torch.tensor([1, 1]), survival=survival)
    planner = BudgetPlanner(learn_online=False, per_row_depths=True)
    # rows worth 1 and 0.25 (two priority steps apart): 1.25 in 10 ms; the interactive slot, + 0.6 in 12 ms, pays
    # (0.154 a ms against 0.125); the batch row's, + 0.15 in 14 ms (0.143), does not; unweighted, the tie goes to row 0
    planner.step_time = StepTimeModel([(1, 8e-3), (64, 134e-3)])
    for interactive in (0, 1):
        for b, seq in enumerate(rows):
            seq.params = SamplingParams(priority=0 if b == interactive else 2)
        depths = planner.row_depths(rows, proposal, [1, 1])
        assert depths[interactive] == 1 and depths[1 - interactive] == 0


def test_by_default_the_budget_keeps_one_depth_for_the_batch_on_a_ragged_target():
    """Per-row depths are opt-in (BudgetPlanner.per_row_depths): by default a ragged target gets the padded rule's
    one depth, each row cut to its own draft count."""
    planner = BudgetPlanner(learn_online=False)
    planner.step_time = StepTimeModel([(1, 4e-3), (64, 67e-3)])
    survival = torch.tensor([[0.95, 0.9, 0.85, 0.8], [0.1, 0.01, 0.0, 0.0], [0.05, 0.0, 0.0, 0.0]])
    proposal = PaddedProposal(torch.ones(3, 4, dtype=torch.long), torch.tensor([4, 2, 1]), survival=survival)
    rows = greedy_rows(3, cache_len=16)
    depth = planner.chain_depth(rows, proposal, [4, 2, 1])
    assert planner.row_depths(greedy_rows(3, cache_len=16), proposal, [4, 2, 1]) == [min(n, depth) for n in (4, 2, 1)]
