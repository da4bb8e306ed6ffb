"""Token trees in the engine: the tree bookkeeping, the accepted path and its KV compaction, greedy fidelity of tree
drafts, the budget cutting (never refusing) a tree, and targets without tree attention getting first-child chains."""

from __future__ import annotations

import pytest
import torch

from deepspec.decoding import SamplingParams, SpecEngine
from deepspec.decoding.drafter import Drafter, DraftSampling, PaddedProposal, Proposal
from deepspec.decoding.drafters.random import RandomDrafter
from deepspec.decoding.params import AcceptanceStats, GenerationResult
from deepspec.decoding.planner import BudgetPlanner
from deepspec.decoding.tree import (
    first_children,
    keep_best_nodes,
    keep_nodes,
    monotone_survival,
    node_depths,
    top_nodes,
    tree_survival_from_record,
    with_root,
)
from deepspec.decoding.verify_budget import StepTimeModel
from tests.conftest import make_tiny_target
from tests.deepspec.decoding.checked import parents_of, probs_of, survival_of
from tests.deepspec.decoding.test_engine import PROMPTS


@pytest.fixture(scope="module")
def target():
    return make_tiny_target(eos=False, temperature=4.0)[0]


def _reference(target, prompts=PROMPTS, max_tokens=24):
    engine = SpecEngine(target, None, max_batch_size=1, max_seq_len=128)
    return [r.token_ids for r in engine.generate(prompts, SamplingParams(max_tokens=max_tokens))]


# ---- bookkeeping -------------------------------------------------------------------------------------------------
def test_tree_bookkeeping_on_a_hand_built_tree():
    # drafter numbering (-1 = root): 0 and 1 follow the root, 2 and 3 follow 1, 4 follows 3, 5 follows 0
    parents = torch.tensor([[-1, -1, 1, 1, 3, 0]])
    num = torch.tensor([6])
    assert with_root(parents, num).tolist() == [[-1, 0, 0, 2, 2, 4, 1]]
    assert with_root(parents, torch.tensor([2])).tolist() == [[-1, 0, 0, 0, 0, 0, 0]]  # padding hangs off the root
    assert node_depths(parents, num).tolist() == [[1, 1, 2, 2, 3, 2]]
    # a child never survives more often than its parent; past num_tokens survival is 0
    survival = torch.tensor([[0.2, 0.9, 0.5, 0.95, 0.6, 0.3]])
    capped = monotone_survival(survival, parents, num)
    torch.testing.assert_close(capped, torch.tensor([[0.2, 0.9, 0.5, 0.9, 0.6, 0.2]], dtype=torch.float64))
    assert monotone_survival(survival, parents, torch.tensor([3]))[0, 3:].tolist() == [0, 0, 0]


def test_keep_nodes_renumbers_the_kept_subtree():
    tokens = torch.tensor([[10, 11, 12, 13, 14, 15]])
    probs = torch.eye(16)[tokens]
    proposal = PaddedProposal(tokens, torch.tensor([6]), probs, torch.rand(1, 6), torch.tensor([[-1, -1, 1, 1, 3, 0]]))
    kept = keep_nodes(proposal, torch.tensor([[False, True, False, True, True, False]]))
    assert kept.tokens.tolist() == [[11, 13, 14]] and parents_of(kept).tolist() == [[-1, 0, 1]]
    assert kept.num_tokens.tolist() == [3] and probs_of(kept).argmax(-1).tolist() == [[11, 13, 14]]
    torch.testing.assert_close(kept.survival, survival_of(proposal)[:, [1, 3, 4]])


def test_keep_best_nodes_keeps_the_likeliest_subtree_numbered_depth_by_depth():
    # candidates (-1 = root): 0 and 1 follow the root, 2 and 3 follow 0, 4 follows 1, 5 follows 2
    parents = torch.tensor([[-1, -1, 0, 0, 1, 2]])
    survival = torch.tensor([[0.5, 0.9, 0.3, 0.45, 0.6, 0.2]])
    live = torch.ones(1, 6, dtype=torch.bool)
    index, new_parents, num = keep_best_nodes(survival, parents, live, 4)
    # the 4 best: 1 (0.9), 4 (0.6), 0 (0.5), 3 (0.45); depth 1 likelier first (1, 0), then depth 2 (4, 3)
    assert num.tolist() == [4] and index.tolist() == [[1, 0, 4, 3]] and new_parents.tolist() == [[-1, -1, 0, 1]]
    # a threshold drops the nodes under it, but the row's best always stays
    index, new_parents, num = keep_best_nodes(survival, parents, live, 4, threshold=0.55)
    assert num.tolist() == [2] and index[0, :2].tolist() == [1, 4] and new_parents.tolist() == [[-1, 0, -1, -1]]
    index, _, num = keep_best_nodes(survival, parents, live, 4, threshold=0.95)
    assert num.tolist() == [1] and index[0, 0] == 1
    # a child that claims more than its parent is capped at it, so the kept set is still a tree (5 > 2 > 0 here),
    # and ties go to the earlier node: the parent first; dead nodes are never kept; k past the nodes pads
    odd = torch.tensor([[0.5, 0.1, 0.4, 0.05, 0.05, 0.99]])
    index, new_parents, num = keep_best_nodes(odd, parents, live & (torch.arange(6) != 1), 8)
    assert num.tolist() == [4] and index[0, :4].tolist() == [0, 2, 3, 5]
    assert new_parents.tolist() == [[-1, 0, 0, 1, -1, -1, -1, -1]]


def _best_nodes_one_by_one(survival: list[float], parents: list[int], k: int, threshold: float) -> list[int]:
    """The rule keep_best_nodes implements, node by node: take nodes by survival (ties: the earlier one) while a
    node's parent is taken and it clears the threshold (the first always), k at most; then order them by depth."""
    order = sorted(range(len(survival)), key=lambda i: -survival[i])
    kept: list[int] = []
    for i in order:
        if len(kept) < k and (parents[i] < 0 or parents[i] in kept) and (survival[i] >= threshold or not kept):
            kept.append(i)
    depth = [0] * len(parents)
    for i, p in enumerate(parents):
        depth[i] = 1 if p < 0 else depth[p] + 1
    return sorted(kept, key=lambda i: depth[i])


def test_keep_best_nodes_matches_the_rule_taken_node_by_node():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        M = int(torch.randint(1, 12, (1,), generator=g))
        parents = ((torch.rand(M, generator=g) * torch.arange(1, M + 1)).long() - 1).tolist()
        survival = []
        for p in parents:  # never above the parent, with ties now and then
            step = 1.0 if torch.rand((), generator=g) < 0.2 else float(torch.rand((), generator=g))
            survival.append(round((1.0 if p < 0 else survival[p]) * step, 2))
        k, threshold = int(torch.randint(1, M + 2, (1,), generator=g)), float(torch.rand((), generator=g)) * 0.5
        index, new_parents, num = keep_best_nodes(
            torch.tensor([survival]), torch.tensor([parents]), torch.ones(1, M, dtype=torch.bool), k, threshold
        )
        want = _best_nodes_one_by_one(survival, parents, k, threshold)
        n = int(num[0])
        assert index[0, :n].tolist() == want, (survival, parents, k, threshold)
        assert new_parents[0, :n].tolist() == [-1 if parents[i] < 0 else want.index(parents[i]) for i in want]


def test_the_pruning_is_top_k_by_survival_with_ties_to_the_earlier_node():
    survival = torch.tensor([[0.5, 0.5, 0.7, 0.0], [0.2, 0.9, 0.1, 0.3]])
    live = torch.tensor([[True, True, True, True], [True, True, True, False]])
    assert top_nodes(survival, live, 2).tolist() == [[True, False, True, False], [True, True, False, False]]
    assert top_nodes(survival, live, 0).sum() == 0
    assert top_nodes(survival, live, 9, threshold=0.4).tolist() == [
        [True, True, True, False],
        [False, True, False, False],
    ]


def test_first_children_is_the_chain_a_chain_target_verifies():
    tokens = torch.tensor([[10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25]])
    parents = torch.tensor([[-1, -1, 1, 1, 3, 0], [-1, 0, -1, 1, 1, 3]])
    chain = first_children(PaddedProposal(tokens, torch.tensor([6, 6]), parents=parents))
    # row 0: root → 0 → 5 (0's first child; 1 is 0's sibling); row 1: root → 0 → 1 → 3 → 5 (2, 4: siblings)
    assert chain.parents is None and chain.num_tokens.tolist() == [2, 4]
    assert chain.tokens[0, :2].tolist() == [10, 15] and chain.tokens[1].tolist() == [20, 21, 23, 25]
    # nodes past num_tokens are not part of the tree, whatever their parents say
    short = first_children(PaddedProposal(tokens, torch.tensor([1, 0]), None, None, parents))
    assert short.num_tokens.tolist() == [1, 0]


def test_record_survival_is_shared_by_the_nodes_of_a_level():
    record = torch.tensor([[0.8, 0.4, 0.2]], dtype=torch.float64)
    parents = torch.tensor([[-1, -1, 0, 0, 2]])
    s = tree_survival_from_record(record, parents, torch.tensor([5]))
    # level 1: nodes 0, 1 share 0.8 as 2:1; level 2: nodes 2, 3 share 0.4 as 2:1; level 3: node 4 gets 0.2
    torch.testing.assert_close(
        s, torch.tensor([[0.8 * 2 / 3, 0.8 / 3, 0.4 * 2 / 3, 0.4 / 3, 0.2]], dtype=torch.float64)
    )


def test_acceptance_stats_count_depth_for_trees():
    stats = AcceptanceStats()
    stats.record(num_drafts=6, num_accepted=2, depth=3)  # a 6-node tree 3 deep, path of 2 accepted
    stats.record(num_drafts=2, num_accepted=2)  # a chain of 2
    assert stats.proposed_per_position == [2, 2, 1] and stats.accepted_per_position == [2, 2, 0]
    assert (stats.num_steps, stats.num_draft_tokens, stats.num_accepted_tokens) == (2, 8, 4)
    assert stats.acceptance_length == 3.0 and stats.verify_tokens_per_step == 5.0
    result = GenerationResult("r", [1], num_steps=2, num_drafted_steps=2, num_accepted_tokens=4)  # keywords
    assert result.acceptance_length == 3.0 and isinstance(result, AcceptanceStats)


# ---- the engine --------------------------------------------------------------------------------------------------
class _ScriptedTree(Drafter):
    """Knows the target's greedy continuation and hides it in a tree: the right first token is the root's second
    child, the right second token the second child of that, the third one under it, with wrong siblings around.
    Drafter numbering: 0 wrong, 1 right(1), 2 wrong (child of 1), 3 right(2), 4 right(3) under 3, 5 under 0."""

    name = "scripted-tree"

    def __init__(self, prompts: list[list[int]], outputs: list[list[int]], vocab: int):
        self.full = {tuple(p): p + o for p, o in zip(prompts, outputs)}
        self.vocab = vocab

    def _continuation(self, history: list[int]) -> list[int]:
        for full in self.full.values():
            if full[: len(history)] == history:
                return full[len(history) :] + [0, 0, 0]
        raise AssertionError("unknown sequence")

    def propose(self, view, slots, k, sampling: DraftSampling) -> Proposal:
        tokens, parents = [], torch.tensor([[-1, -1, 1, 1, 3, 0]] * len(slots))
        for slot in slots:
            c = self._continuation(view.tokens(slot).tolist())  # the engine's record of the slot's tokens
            wrong = [(t + 1) % self.vocab for t in c]
            tokens.append([wrong[0], c[0], wrong[1], c[1], c[2], c[1]])
        n = min(k, 6)
        return Proposal.from_rows(torch.tensor(tokens)[:, :n], torch.full((len(slots),), n), parents=parents[:, :n])


def test_the_longest_accepted_path_is_committed_and_its_kv_compacted(target):
    prompts = PROMPTS[:3]
    reference = _reference(target, prompts, max_tokens=13)
    drafter = _ScriptedTree(prompts, reference, 16)
    engine = SpecEngine(target, drafter, max_batch_size=3, max_seq_len=128, num_speculative_tokens=6)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, SamplingParams(max_tokens=13), keep_result=True)
    outputs = engine.step()  # prefill + the first tree round
    assert all(o.num_draft_tokens == 6 and o.num_accepted_tokens == 3 and o.num_verify_tokens == 7 for o in outputs)
    # the KV entries of the path (nodes 1, 3, 4) now sit after the prefix: one more token scored on the cache
    # gives the logits of a fresh prefill of everything committed
    with torch.inference_mode():
        for seq in engine._running:
            committed = seq.prompt + seq.output
            assert seq.cache_len == len(committed) - 1
            cached = target.forward(
                torch.tensor([[seq.pending]]), torch.tensor([seq.cache_len]), engine.cache.rows(seq.slot, 1)
            ).logits[0, -1]
            fresh = target.forward(torch.tensor([committed]), torch.tensor([0])).logits[0, -1]
            torch.testing.assert_close(cached, fresh, atol=1e-5, rtol=1e-5)
    while engine.has_unfinished():
        outputs += engine.step()
    results = [engine.pop_result(str(i)) for i in range(3)]
    assert [r.token_ids for r in results] == reference
    # every round that could hold the whole tree took its 3-deep path (near max_tokens the node cap cuts the tree)
    whole = [o for o in outputs if o.num_draft_tokens == 6]
    assert len(whole) == 6 and all(o.num_accepted_tokens == 3 for o in whole)


@pytest.mark.parametrize("budget", [False, True], ids=["all-nodes", "budgeted"])
def test_greedy_tree_speculation_is_token_identical_to_target_only(target, budget):
    reference = _reference(target)
    for batch in (1, 3, 8):  # 3 < len(PROMPTS): requests join and leave mid-run (slot compaction)
        # budgeted: a fixed cost model (0.3 ms a token on a 10 ms pass), not this busy CPU's probe
        planner = BudgetPlanner(StepTimeModel([(1, 0.010), (64, 0.010 + 63 * 0.0003)])) if budget else None
        engine = SpecEngine(
            target,
            RandomDrafter(16, seed=1, tree=True),
            max_batch_size=batch,
            max_seq_len=128,
            num_speculative_tokens=6,
            planner=planner,
        )
        results = engine.generate(PROMPTS, SamplingParams(max_tokens=24))
        assert [r.token_ids for r in results] == reference, batch
        assert sum(r.num_accepted_tokens for r in results) > 0
        for r in results:
            assert r.num_steps + r.num_accepted_tokens == 23
            assert r.num_verify_tokens == r.num_steps + r.num_draft_tokens


def test_a_target_without_tree_attention_verifies_first_child_chains(target, monkeypatch):
    reference = _reference(target)
    engine = SpecEngine(
        target, RandomDrafter(16, seed=1, tree=True), max_batch_size=3, max_seq_len=128, num_speculative_tokens=6
    )
    engine.tree_attention = False
    monkeypatch.setattr(target, "forward", _no_trees(target.forward))
    results = engine.generate(PROMPTS, SamplingParams(max_tokens=24))
    assert [r.token_ids for r in results] == reference
    assert sum(r.num_draft_tokens for r in results) > 0


def _no_trees(forward):
    def chain_only(*args, tree_parents=None, **kwargs):
        assert tree_parents is None, "a chain target was handed a tree"
        return forward(*args, **kwargs)

    return chain_only


def test_a_tree_over_budget_is_cut_not_refused(target):
    """A 6-node tree whose estimates say 2 nodes pay: the engine verifies the 2 likeliest (an ancestor-closed
    pair), not none and not all; with extra tokens free it verifies all 6. Output stays target-only greedy."""

    class _Confident(RandomDrafter):
        def propose(self, view, slots, k, sampling):
            p = super().propose(view, slots, k, sampling).padded(k)
            p.num_tokens = torch.full_like(p.num_tokens, k)
            p.survival = torch.tensor([[0.9, 0.8] + [0.01] * (k - 2)] * len(slots))[:, :k]
            p.parents = torch.arange(-1, k - 1).expand(len(slots), k).clone()
            parents_of(p)[:, 2:] = -1  # nodes 0 → 1 a chain, the rest siblings of node 0
            return p.ragged()

    reference = _reference(target, PROMPTS[:2], 12)
    engine = SpecEngine(
        target,
        _Confident(16, seed=3, tree=True),
        max_batch_size=2,
        max_seq_len=128,
        num_speculative_tokens=6,
        planner=BudgetPlanner(),
    )
    engine.planner.step_time = StepTimeModel([(1, 0.010), (64, 0.010 + 63 * 0.003)])  # 3 ms a token on a 10 ms pass
    outputs = []
    cut = engine.generate(PROMPTS[:2], SamplingParams(max_tokens=12), on_output=outputs.append)
    assert [r.token_ids for r in cut] == reference
    rounds = [o.num_draft_tokens for o in outputs if o.num_verify_tokens]
    assert max(rounds) == 2 and rounds[:10] == [2] * 10  # the last rounds of a row are capped by max_tokens
    engine.planner.step_time = StepTimeModel([(1, 0.010), (64, 0.010)])
    outputs.clear()
    free = engine.generate(PROMPTS[:2], SamplingParams(max_tokens=12), on_output=outputs.append)
    assert [r.token_ids for r in free] == reference
    assert max(o.num_draft_tokens for o in outputs) == 6


def test_a_malformed_tree_is_a_clear_error(target):
    class _Bad(RandomDrafter):
        def propose(self, view, slots, k, sampling):
            p = super().propose(view, slots, k, sampling).padded(k)
            p.num_tokens, p.parents = torch.full_like(p.num_tokens, k), torch.full_like(p.tokens, 5)
            return p.ragged()

    engine = SpecEngine(target, _Bad(16, tree=True), max_batch_size=1, max_seq_len=64, num_speculative_tokens=3)
    with pytest.raises(ValueError, match="malformed tree"):
        engine.generate([[1, 2, 3]], SamplingParams(max_tokens=4))
