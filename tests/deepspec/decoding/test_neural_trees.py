"""Token trees from the neural drafts (EAGLE-2's dynamic tree): shape, topological parents, q rows, survival that
never exceeds the parent's, Eagle3's tree attention against a chain fed the same path, greedy output identical to
target-only, and a chi-square on the first token a sampled tree commits (with a negative control)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from deepspec.decoding.draft_driver import DraftDriver
from deepspec.decoding.drafter import DraftSampling
from deepspec.decoding.drafters.dflash import DFlashDrafter
from deepspec.decoding.drafters.eagle3 import Eagle3Drafter
from deepspec.decoding.drafters.neural import NeuralDrafter, TreeShape
from deepspec.decoding.engine import SpecEngine
from deepspec.decoding.params import SamplingParams
from plugins.reference.tree import tree_accept
from tests.deepspec.decoding.checked import drafter_of, parents_of, probs_of, survival_of
from tests.deepspec.decoding.test_trained_drafters import ALGOS, PROMPTS, _drafter
from tests.training.helpers import tiny_target


@pytest.fixture(scope="module")
def target():
    """The same tiny target as the chain tests (test_trained_drafters), with their drafts and prompts."""
    return tiny_target()


def _bound(target, algo, tmp_path, slots=2, **kw) -> DraftDriver:
    """A bound drafter driven as the engine drives it: slot s holds 1, 2 + s, 3, 4 with random features."""
    drafter = _drafter(target, algo, tmp_path, **kw)
    driver = DraftDriver(drafter, num_slots=slots, max_tokens=64, target=target)
    torch.manual_seed(1)
    for s in range(slots):
        driver.start(s, [1, 2 + s, 3, 4], torch.randn(1, 3, drafter.cfg.feature_size))
    return driver


def _check_tree(prop, k):
    B = prop.tokens.shape[0]
    assert prop.tokens.shape == (B, k) and parents_of(prop).shape == (B, k) and survival_of(prop).shape == (B, k)
    for b in range(B):
        n = int(prop.num_tokens[b])
        assert 1 <= n <= k
        parents = parents_of(prop)[b, :n].tolist()
        surv = survival_of(prop)[b, :n]
        assert parents[0] == -1
        for i, p in enumerate(parents):
            assert -1 <= p < i  # topological
            bound = 1.0 if p < 0 else float(surv[p])
            assert 0 < float(surv[i]) <= bound + 1e-6  # never outlives its parent
        # siblings together never outlive their parent
        for p in set(parents):
            kids = [i for i, q in enumerate(parents) if q == p]
            assert float(surv[kids].sum()) <= (1.0 if p < 0 else float(surv[p])) + 1e-5
        assert (survival_of(prop)[b, n:] == 0).all()
        # numbered depth by depth, the likelier node first within a depth (tree.keep_best_nodes)
        depth = []
        for p in parents:
            depth.append(1 if p < 0 else depth[p] + 1)
        assert depth == sorted(depth)
        for i in range(1, n):
            assert depth[i] > depth[i - 1] or float(surv[i]) <= float(surv[i - 1])


@pytest.mark.parametrize("algo", ALGOS)
def test_greedy_tree_shape_parents_and_survival(target, algo, tmp_path):
    driver = (
        _bound(target, algo, tmp_path, tree_branches=3, confidence_threshold=0.0)
        if algo == "dspark"
        else _bound(target, algo, tmp_path, tree_branches=3)
    )
    prop = driver.propose([0, 1], 10, DraftSampling(torch.tensor([0.0, 0.0]), [None, None]))
    assert prop.is_tree and prop.probs is None
    _check_tree(prop, 10)
    assert prop.num_tokens.tolist() == [10, 10]
    assert bool(torch.isin(prop.tokens, drafter_of(driver.drafter, NeuralDrafter).model.d2t).all())
    # siblings differ, and a branching of 3 gives the root 3 children
    for b in range(2):
        parents = parents_of(prop)[b].tolist()
        assert parents.count(-1) == 3
        for p in set(parents):
            kids = [int(prop.tokens[b, i]) for i, q in enumerate(parents) if q == p]
            assert len(kids) == len(set(kids))


@pytest.mark.parametrize("algo", ALGOS)
def test_greedy_tree_first_children_follow_the_draft_argmax(target, algo, tmp_path):
    """The root's first child is the chain's first draft; with branches = width = 1 the tree is the chain."""
    chain = (
        _bound(target, algo, tmp_path / "c", confidence_threshold=0.0)
        if algo == "dspark"
        else _bound(target, algo, tmp_path / "c")
    )
    kw: dict[str, Any] = {"confidence_threshold": 0.0} if algo == "dspark" else {}
    line = _bound(target, algo, tmp_path / "t", tree_branches=1, **kw)
    greedy = DraftSampling(torch.tensor([0.0, 0.0]), [None, None])
    a, b = chain.propose([0, 1], 4, greedy), line.propose([0, 1], 4, greedy)
    assert torch.equal(a.tokens, b.tokens)
    assert parents_of(b).tolist() == [[-1, 0, 1, 2]] * 2


def test_eagle3_tree_attention_matches_a_chain_fed_the_same_path(target, tmp_path):
    """Every expanded node's first child must be the argmax after feeding its root path as a chain: the node's
    cache entry, RoPE position and ancestor mask are right (a sibling leaking into the mask changes it)."""
    driver = _bound(target, "eagle3", tmp_path, tree_branches=3, tree_depth=4)
    drafter = drafter_of(driver.drafter, Eagle3Drafter)
    cache = (drafter.cache_k.clone(), drafter.cache_v.clone())
    prop = driver.propose([0, 1], 16, DraftSampling(torch.tensor([0.0, 0.0]), [None, None]))
    model = drafter.model
    checked = 0
    for b in range(2):
        n = int(prop.num_tokens[b])
        parents = parents_of(prop)[b, :n].tolist()
        for node in range(n):
            kids = [i for i, p in enumerate(parents) if p == node]
            if not kids:
                continue
            path = [node]
            while parents[path[0]] >= 0:
                path.insert(0, parents[path[0]])
            ck, cv = cache[0].clone(), cache[1].clone()
            rows = torch.tensor([b])
            h = drafter.last_h[b][None, None]
            length = int(drafter.length[b])
            for depth, i in enumerate(path):
                h = model.cached_step(h, prop.tokens[b, i].view(1, 1), torch.tensor([[length + depth]]), ck, cv, rows)
            best = model.to_target_ids(model.logits(h[:, 0]).argmax(-1))
            assert int(prop.tokens[b, kids[0]]) == int(best[0])
            checked += 1
    assert checked >= 4


@pytest.mark.parametrize("algo", ALGOS)
def test_sampled_tree_carries_q_on_drawn_nodes_only(target, algo, tmp_path):
    kw: dict[str, Any] = {"confidence_threshold": 0.0} if algo == "dspark" else {}
    driver = _bound(target, algo, tmp_path, tree_branches=3, **kw)
    sampling = DraftSampling(torch.tensor([1.0, 0.0]), [torch.Generator().manual_seed(0), None])
    prop = driver.propose([0, 1], 10, sampling)
    _check_tree(prop, 10)
    V = target.vocab_size
    assert probs_of(prop).shape == (2, 10, V)
    for b in range(2):
        n = int(prop.num_tokens[b])
        rows = probs_of(prop)[b, :n]
        assert torch.allclose(rows.sum(-1), torch.ones(n))
        assert (rows.gather(-1, prop.tokens[b, :n, None]) > 0).all()
        one_hot = rows.max(-1).values == 1.0
        parents = parents_of(prop)[b, :n].tolist()
        first_children = {parents.index(p) for p in set(parents)}
        if b == 1:  # greedy row: every node chosen, so every q is one-hot
            assert one_hot.all()
        else:  # sampled row: exactly the first child of each expanded node is drawn (a softmax over the vocab)
            for i in range(n):
                assert bool(one_hot[i]) == (i not in first_children)


@pytest.mark.parametrize("algo", ALGOS)
def test_greedy_tree_output_identical_to_target_only(target, algo, tmp_path):
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    base = SpecEngine(target, None, max_batch_size=2, max_seq_len=128).generate(PROMPTS, params)
    drafter = _drafter(target, algo, tmp_path, tree_branches=2)
    engine = SpecEngine(target, drafter, max_batch_size=2, max_seq_len=128, num_speculative_tokens=6)
    spec = engine.generate(PROMPTS, params)
    assert [r.token_ids for r in spec] == [r.token_ids for r in base]
    assert all(r.num_draft_tokens > 0 for r in spec)


def _first_token_counts(driver, target_logits, rounds: int, rows: int, honest: bool) -> torch.Tensor:
    """Run tree_accept on fresh draws of the driven drafter's sampled tree (`rows` slots holding the same context, so
    one call draws `rows` independent trees); count the first committed token. Dishonest: the chosen (top-k) siblings
    claim the q their drawn sibling came from, as if they had been sampled."""
    V = target_logits.shape[-1]
    counts = torch.zeros(V)
    slots = list(range(rows))
    gens: list[torch.Generator | None] = [torch.Generator().manual_seed(10_000 + r) for r in slots]
    for t in range(rounds):
        prop = driver.propose(slots, 6, DraftSampling(torch.ones(rows), gens))
        n = prop.num_tokens
        tokens = torch.cat([torch.zeros(rows, 1, dtype=torch.long), prop.tokens], dim=1)
        tree_parents = parents_of(prop)
        parents = torch.cat([torch.full((rows, 1), -1), torch.where(tree_parents < 0, 0, tree_parents + 1)], 1)
        q = probs_of(prop).clone()
        if not honest:
            for b in range(rows):
                plist = tree_parents[b, : int(n[b])].tolist()
                for i, par in enumerate(plist):
                    q[b, i] = q[b, plist.index(par)]
        probs = torch.cat([torch.zeros(rows, 1, V), q], dim=1)
        num, nxt, path = tree_accept(
            tokens,
            parents,
            n + 1,
            target_logits.expand(rows, -1, -1),
            probs,
            torch.ones(rows),
            torch.zeros(rows, dtype=torch.long),
            torch.ones(rows),
            torch.arange(rows) + rows * t + (0 if honest else 7_777_777),
        )
        first = torch.where(num >= 1, tokens.gather(1, path[:, 1:2].clamp(min=0))[:, 0], nxt)
        counts += torch.bincount(first, minlength=V).float()
    return counts


@pytest.mark.slow
def test_sampled_neural_tree_is_lossless_chi_square(target, tmp_path, monkeypatch):
    """The first committed token of a sampled DFlash tree (drawn first child + deterministic siblings) follows the
    target's distribution; siblings chosen by top-k that claim their drawn sibling's q are caught."""
    rows = 500
    drafter = drafter_of(_drafter(target, "dflash", tmp_path, tree_branches=3), DFlashDrafter)
    driver = DraftDriver(drafter, num_slots=rows, max_tokens=64, target=target)
    block = drafter._block_hidden

    # an untrained draft is nearly uniform; sharpen it so q differs from one-hot and from the target alike
    def sharpened(slots: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, logits = block(slots)
        return hidden, 4.0 * logits

    monkeypatch.setattr(drafter, "_block_hidden", sharpened)
    features = torch.randn(1, 3, drafter.cfg.feature_size, generator=torch.Generator().manual_seed(1))
    for s in range(rows):
        driver.start(s, [1])  # reset only: the prompt's other tokens come in one batched commit, as before
    driver.commit(list(range(rows)), [[2, 3, 4]] * rows, features.expand(rows, -1, -1))
    V = target.vocab_size
    target_logits = torch.randn(1, 7, V, generator=torch.Generator().manual_seed(2)) * 1.5
    p = torch.softmax(target_logits[0, 0], -1)
    rounds = 4
    expected = p * rounds * rows
    keep = expected >= 5
    dof = int(keep.sum())  # kept categories + the lumped rest, minus one
    # chi-square critical value at p = 0.001 (Wilson-Hilferty approximation)
    critical = dof * (1 - 2 / (9 * dof) + 3.09 * (2 / (9 * dof)) ** 0.5) ** 3

    def chi2(counts):
        observed = torch.cat([counts[keep], counts[~keep].sum()[None]])
        wanted = torch.cat([expected[keep], expected[~keep].sum()[None]])
        return float(((observed - wanted) ** 2 / wanted.clamp(min=1e-9)).sum())

    assert chi2(_first_token_counts(driver, target_logits, rounds, rows, honest=True)) < critical
    assert chi2(_first_token_counts(driver, target_logits, rounds, rows, honest=False)) > critical


def test_tree_options_are_checked(target, tmp_path):
    with pytest.raises(ValueError, match="branches and width"):
        TreeShape(0, 2)
    with pytest.raises(ValueError, match="speculative cache entries"):
        _drafter(target, "eagle3", tmp_path, tree_branches=16, tree_depth=8)
