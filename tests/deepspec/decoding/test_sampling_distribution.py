"""Speculative sampling must draw from exactly the target's distribution (Leviathan/Chen rejection rule).

A vocabulary of 5 and a random tiny target give a joint of the first three generated tokens over 125 cells,
computed exactly from the model. 3,000 seeded generations land in those cells; a chi-square test at
alpha = 1e-3 must not reject. The seeds are fixed, so the test is deterministic, and the last tests show it
has teeth: a verifier that accepts every draft (of a chain, or along a tree's first children) is rejected by the
same check. Trees are random shapes over the same budget, with a random q per node when the drafts carry q.
"""

import itertools

import pytest
import torch
from scipy.stats import chisquare

import plugins
from deepspec.decoding import SamplingParams, SpecEngine
from deepspec.decoding import engine as engine_module
from deepspec.decoding.drafters.random import RandomDrafter
from tests.conftest import make_tiny_target
from tests.deepspec.decoding.exact_joint import exact_joint

VOCAB, PROMPT, N = 5, [1, 2, 3], 3000


@pytest.fixture(scope="module")
def target():
    return make_tiny_target(vocab_size=VOCAB, hidden=32, eos=False, seed=3, temperature=8.0)[0]


def _exact_joint(target, params: SamplingParams) -> dict[tuple, float]:
    return exact_joint(target, PROMPT, VOCAB, params.temperature, params.top_k, params.top_p)


def _p_value(target, drafter, params: SamplingParams) -> float:
    # the verification budget off: it could decide that drafting does not pay, and this test is about the drafts
    engine = SpecEngine(
        target, drafter, max_batch_size=64, max_seq_len=32, num_speculative_tokens=3, max_verify_tokens=64 * 4
    )
    # 5 tokens, of which the first 3 are counted: with max_tokens=3 the first round could verify one draft only
    runs = [
        SamplingParams(max_tokens=5, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, seed=i)
        for i in range(N)
    ]
    results = engine.generate([PROMPT] * N, runs)
    assert sum(r.num_draft_tokens for r in results) > N // 4  # speculation really happened
    counts = {cell: 0 for cell in itertools.product(range(VOCAB), repeat=3)}
    for r in results:
        counts[tuple(r.token_ids[:3])] += 1
    joint = _exact_joint(target, params)
    cells = [c for c in counts if joint[c] * N >= 5]  # pool the rare cells into one
    observed = [counts[c] for c in cells] + [N - sum(counts[c] for c in cells)]
    expected = [joint[c] * N for c in cells] + [N - sum(joint[c] * N for c in cells)]
    return float(chisquare(observed, expected).pvalue)


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("with_probs", [True, False], ids=["drafts-with-q", "deterministic-drafts"])
def test_speculative_sampling_matches_target_distribution(target, with_probs, tree):
    drafter = RandomDrafter(VOCAB, seed=7, sample_probs=with_probs, tree=tree)
    assert _p_value(target, drafter, SamplingParams(temperature=1.0)) > 1e-3


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_filtered_sampling_matches_filtered_target(target, tree):
    params = SamplingParams(temperature=0.7, top_k=3, top_p=0.9)
    assert _p_value(target, RandomDrafter(VOCAB, seed=2, sample_probs=True, tree=tree), params) > 1e-3


def test_the_check_rejects_a_verifier_that_accepts_everything(target, monkeypatch):
    real_walk = plugins.rejection_sample_host

    def accept_all(drafts, num_drafts, logits, draft_probs, *sampling):
        after_block = logits[torch.arange(logits.shape[0]), num_drafts][:, None]
        bonus = real_walk(drafts[:, :0], torch.zeros_like(num_drafts), after_block, None, *sampling)[1]
        return num_drafts.tolist(), bonus

    # what the engine's verify_result calls for sampled rows on CPU
    monkeypatch.setattr(plugins, "rejection_sample_host", accept_all)
    assert _p_value(target, RandomDrafter(VOCAB, seed=7, sample_probs=True), SamplingParams(temperature=1.0)) < 1e-3


def test_the_check_rejects_a_tree_verifier_that_accepts_first_children(target, monkeypatch):
    """The same teeth for trees: a verifier that takes every row's chain of first children unchecked."""
    real_verify_tree = engine_module.verify_tree

    def accept_first_children(tree_tokens, parents, num_nodes, logits, draft_probs, sampling):
        B, N = tree_tokens.shape
        path = torch.full((B, N), -1, dtype=torch.long)
        path[:, 0] = 0
        depth = torch.zeros(B, dtype=torch.long)
        for b in range(B):
            node = 0
            for i in range(1, int(num_nodes[b])):
                if int(parents[b, i]) == node:  # the first child of the current node: taken
                    node, depth[b] = i, depth[b] + 1
                    path[b, depth[b]] = i
        last = path.gather(1, depth[:, None]).squeeze(1)
        one = torch.zeros(B, 1, dtype=torch.long)
        after = logits[torch.arange(B), last][:, None]
        bonus = real_verify_tree(one, one - 1, torch.ones(B, dtype=torch.long), after, None, sampling)[1]
        return depth, bonus, path

    monkeypatch.setattr(engine_module, "verify_tree", accept_first_children)
    drafter = RandomDrafter(VOCAB, seed=7, sample_probs=True, tree=True)
    assert _p_value(target, drafter, SamplingParams(temperature=1.0)) < 1e-3
