"""Corpus trees: branches where the corpus's continuations disagree, their order, the node budget, prompt lookup's
branch, and the q sampled trees carry — checked exact by a chi-square through plugins.tree_accept."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

import plugins
from deepspec.decoding.draft_driver import DraftDriver
from deepspec.decoding.drafter import DraftSampling
from deepspec.decoding.drafters import corpus_tree
from deepspec.decoding.drafters.corpus_lookup import CorpusLookupDrafter
from deepspec.decoding.drafters.corpus_tree import NodeAcceptance, corpus_source
from deepspec.decoding.drafters.suffix_index import SEPARATOR, SuffixIndex
from tests.deepspec.decoding.checked import drafter_of, parents_of, probs_of, survival_of

S = SEPARATOR
GREEDY = DraftSampling(torch.zeros(1), [None])
# after "1 2" the corpus wrote 3 five times, 4 three times and 5 twice; after "1 2 3": 6 (4x) or 7 (1x)
CORPUS = [1, 2, 3, 6, S] * 4 + [1, 2, 3, 7, S] + [1, 2, 4, 8, S] * 3 + [1, 2, 5, S] * 2


def _driven(history: list[int], corpus=CORPUS, **options) -> DraftDriver:
    """A tree-drafting corpus lookup driven as the engine drives it, its slot 0 holding `history`."""
    d = CorpusLookupDrafter(
        SuffixIndex.build(np.array(corpus), max_match=6), min_ngram=2, max_ngram=3, tree=True, **options
    )
    driver = DraftDriver(d, num_slots=2, max_tokens=64)
    driver.start(0, history)
    return driver


def _check_tree(p, k):
    """The contract every tree proposal keeps: budget, topological parents, survival below the parent's."""
    for row in range(p.tokens.shape[0]):
        n = int(p.num_tokens[row])
        assert 0 <= n <= k
        parents, survival = parents_of(p)[row, :n].tolist(), survival_of(p)[row, :n].tolist()
        for i, parent in enumerate(parents):
            assert -1 <= parent < i
            assert 0 < survival[i] < (1.0 if parent < 0 else survival[parent])
        if p.probs is not None:
            assert torch.allclose(probs_of(p)[row, :n].sum(-1), torch.ones(n))
            assert (probs_of(p)[row, torch.arange(n), p.tokens[row, :n]] > 0).all()  # each token is in its q


def test_the_tree_branches_where_continuations_disagree_most_frequent_first():
    p = _driven([9, 1, 2]).propose([0], 8, GREEDY)
    _check_tree(p, 8)
    n = int(p.num_tokens[0])
    nodes = list(zip(p.tokens[0, :n].tolist(), parents_of(p)[0, :n].tolist()))
    # root children 3 (5/10), 4 (3/10), 5 (2/10) in that order; 6 after 3 and 8 after 4; 7 (1 in 5) after 3 too
    root_children = [t for t, parent in nodes if parent == -1]
    assert root_children == [3, 4, 5]
    three = nodes.index((3, -1))
    assert (6, three) in nodes and (8, nodes.index((4, -1))) in nodes
    assert nodes.index((6, three)) < nodes.index((7, three))
    assert p.probs is None  # greedy rows draft deterministically


def test_the_node_budget_keeps_the_likeliest_nodes():
    d = _driven([9, 1, 2])
    full = d.propose([0], 8, GREEDY)
    for k in (1, 2, 3):
        p = d.propose([0], k, GREEDY)
        _check_tree(p, k)
        n = int(p.num_tokens[0])
        assert n == k
        top = survival_of(full)[0].topk(k).values
        assert torch.allclose(survival_of(p)[0, :n].sort(descending=True).values, top)
    assert d.propose([0], 1, GREEDY).tokens[0, 0] == 3


def test_calibration_ranks_corpus_branches_against_prompt_lookup():
    d = _driven([1, 2, 5, 9, 0, 1, 2], slot_acceptance={"prompt_lookup": [0.6] * 8})
    assert d.propose([0], 1, GREEDY).tokens[0, 0] == 5  # in context (0.6) beats the corpus's raw 5/10
    table = np.full((corpus_tree.MAX_DEPTH_BUCKET, len(corpus_tree.SUPPORT_EDGES), corpus_tree.FREQ_BINS), 0.1)
    table[0, corpus_tree.support_bin(10), corpus_tree.freq_bin(0.5)] = 0.9  # measured: this continuation is safe
    drafter = drafter_of(d.drafter, CorpusLookupDrafter)
    drafter.acceptance = NodeAcceptance({corpus_source(2): table.tolist()}, drafter.slot_acceptance)
    p = d.propose([0], 2, GREEDY)
    assert p.tokens[0].tolist() == [3, 5] and survival_of(p)[0].tolist() == pytest.approx([0.9, 0.6])
    with pytest.raises(ValueError, match="shape"):
        NodeAcceptance({"corpus_2": [[0.5]]})


def test_prompt_lookup_branch_comes_first_and_merges_with_the_corpus():
    # the context holds "1 2 5 9": prompt lookup drafts 5 9, the corpus 3/4/5
    d = _driven([1, 2, 5, 9, 0, 1, 2], slot_acceptance={"prompt_lookup": [0.9] * 8})
    p = d.propose([0], 9, GREEDY)
    _check_tree(p, 9)
    n = int(p.num_tokens[0])
    nodes = list(zip(p.tokens[0, :n].tolist(), parents_of(p)[0, :n].tolist()))
    # in context first, as deep as 0.9^j beats the corpus's 0.5: 5 9 0 1 2
    assert nodes[:5] == [(5, -1), (9, 0), (0, 1), (1, 2), (2, 3)]
    assert [t for t, parent in nodes if parent == -1] == [5, 3, 4]  # 5 is not drafted twice


def test_a_shorter_match_adds_continuations_the_longest_never_saw():
    corpus = [7, 1, 2, 3, S, 1, 2, 4, S, 1, 2, 4, S]
    index = SuffixIndex.build(np.array(corpus), max_match=4)
    levels = index.matches([7, 1, 2])
    assert [m for m, _ in levels] == [3, 2]  # "7 1 2" once, "1 2" three times ("2" alone: no more)
    d = _driven([7, 1, 2], corpus=corpus, max_fallbacks=1)
    p = d.propose([0], 2, GREEDY)
    assert p.tokens[0].tolist() == [3, 4] and parents_of(p)[0].tolist() == [-1, -1]
    only_longest = _driven([7, 1, 2], corpus=corpus, max_fallbacks=0).propose([0], 2, GREEDY)
    assert only_longest.num_tokens.tolist() == [1]


def test_chain_mode_is_unchanged():
    d = _driven([9, 1, 2])
    drafter_of(d.drafter, CorpusLookupDrafter).tree = False
    p = d.propose([0], 4, GREEDY)
    assert p.parents is None and p.tokens[0, : int(p.num_tokens[0])].tolist() == [3, 6]


def _sampled(seed: int, batch: int = 1, temperature: float = 1.0) -> DraftSampling:
    return DraftSampling(
        torch.full((batch,), temperature), [torch.Generator().manual_seed(seed + i) for i in range(batch)]
    )


def test_sampled_rows_draw_children_without_replacement_and_carry_q():
    d = _driven([9, 1, 2], sampled=True, vocab_size=12)
    sampling = DraftSampling(torch.tensor([1.0, 0.0]), [torch.Generator().manual_seed(0), None])
    d.start(1, [9, 1, 2])
    p = d.propose([0, 1], 6, sampling)
    _check_tree(p, 6)
    greedy = probs_of(p)[1, : int(p.num_tokens[1])]
    assert (greedy.max(-1).values == 1).all()  # the greedy row stays deterministic: one-hot rows
    n = int(p.num_tokens[0])
    roots = [i for i in range(n) if parents_of(p)[0, i] == -1]
    assert sorted(p.tokens[0, roots].tolist()) == [3, 4, 5][: len(roots)] or len(
        set(p.tokens[0, roots].tolist())
    ) == len(roots)
    first = probs_of(p)[0, roots[0]]
    assert first[[3, 4, 5]].tolist() == pytest.approx([0.5, 0.3, 0.2])
    if len(roots) > 1:  # the second draw's q leaves out the first child's token
        second = probs_of(p)[0, roots[1]]
        assert second[p.tokens[0, roots[0]]] == 0 and second.sum() == pytest.approx(1.0)
    # the first root child is 3, 4, 5 in proportion 5 : 3 : 2
    counts = np.zeros(12)
    for seed in range(400):
        counts[int(d.propose([0], 1, _sampled(seed)).tokens[0, 0])] += 1
    assert chisquare(counts[[3, 4, 5]], np.array([0.5, 0.3, 0.2]) * 400).pvalue > 1e-3


# -- exactness: trees verified by plugins.tree_accept sample from the target's distribution ----------------------

VOCAB = 10
N = 1500


def _target_logits(tokens: torch.Tensor, parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A fixed 'target': after the root p1, after a first-level node x the distribution p2[x] (deeper: p2[0]).
    Returns the logits [N, width, VOCAB], p1 [VOCAB] and the normalised p2 [VOCAB, VOCAB]."""
    g = torch.Generator().manual_seed(11)
    p1 = torch.tensor([0.02, 0.05, 0.03, 0.30, 0.10, 0.05, 0.15, 0.05, 0.15, 0.10])
    p2 = torch.rand(VOCAB, VOCAB, generator=g) ** 3
    logits = torch.empty(*tokens.shape, VOCAB)
    logits[:, 0] = p1.log()
    for i in range(1, tokens.shape[1]):
        first_level = parents[:, i] == 0
        logits[:, i] = torch.where(first_level[:, None], p2[tokens[:, i]].log(), p2[0].log())
    return logits, p1, p2 / p2.sum(-1, keepdim=True)


def _first_committed(driver: DraftDriver, k: int, probs_override=None) -> tuple[np.ndarray, np.ndarray]:
    """Propose N seeded trees for the same context and verify them in one tree_accept batch → the first committed
    token of each trial (an accepted root child, or the token drawn after all were rejected) and the target's p1."""
    proposals = [driver.propose([0], k, _sampled(seed)) for seed in range(N)]
    width = k + 1
    tokens = torch.zeros(N, width, dtype=torch.long)
    parents = torch.full((N, width), -1, dtype=torch.long)
    probs = torch.zeros(N, width, VOCAB)
    num_nodes = torch.ones(N, dtype=torch.long)
    for b, p in enumerate(proposals):
        n = int(p.num_tokens[0])
        num_nodes[b] = n + 1
        tokens[b, 1 : n + 1] = p.tokens[0, :n]
        parents[b, 1 : n + 1] = parents_of(p)[0, :n] + 1
        if p.probs is not None:
            probs[b, 1 : n + 1] = probs_of(p)[0, :n]
        else:
            probs[b, torch.arange(1, n + 1), p.tokens[0, :n]] = 1.0
    if probs_override is not None:
        probs = probs_override(probs, tokens, num_nodes)
    logits, p1, p2 = _target_logits(tokens, parents)
    num_accepted, next_token, path = plugins.tree_accept(
        tokens,
        parents,
        num_nodes,
        logits,
        probs,
        torch.ones(N),
        torch.zeros(N, dtype=torch.long),
        torch.ones(N),
        torch.arange(N, dtype=torch.long) * 7919 + 1,
    )
    first = torch.where(num_accepted >= 1, tokens.gather(1, path[:, 1:2].clamp(min=0)).squeeze(1), next_token)
    return first.numpy(), p1.numpy()


def _p_value(first: np.ndarray, p1: np.ndarray) -> float:
    observed = np.bincount(first, minlength=VOCAB)
    p1 = p1.astype(np.float64)
    return float(chisquare(observed, p1 / p1.sum() * N).pvalue)


@pytest.mark.parametrize("sampled", [True, False], ids=["sampled-q", "deterministic"])
def test_corpus_trees_verified_at_temperature_one_sample_the_target(sampled):
    corpus = [1, 2, 3, 6, S] * 5 + [1, 2, 4, 8, S] * 3 + [1, 2, 5, S] * 2 + [1, 2, 7, S] * 2
    d = _driven([9, 1, 2], corpus=corpus, sampled=sampled, vocab_size=VOCAB)
    first, p1 = _first_committed(d, 4)
    assert _p_value(first, p1) > 1e-3


def test_the_check_rejects_trees_whose_tokens_were_not_drawn_from_their_q():
    corpus = [1, 2, 3, 6, S] * 5 + [1, 2, 4, 8, S] * 3 + [1, 2, 5, S] * 2 + [1, 2, 7, S] * 2
    d = _driven([9, 1, 2], corpus=corpus, sampled=False, vocab_size=VOCAB)  # deterministic top tokens ...
    q = torch.zeros(VOCAB)
    q[[3, 4, 5, 7]] = torch.tensor([5.0, 3.0, 2.0, 2.0]) / 12

    def claim_sampled(probs, tokens, num_nodes):  # ... verified as if drawn from the frequencies
        probs[:, 1] = q
        return probs

    first, p1 = _first_committed(d, 1, claim_sampled)
    assert _p_value(first, p1) < 1e-3
