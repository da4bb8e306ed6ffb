"""Corpus trees through the engine: sampled trees that carry q still draw exactly the target's distribution
(chi-square over the joint of three generated tokens, with a negative control), and greedy trees change nothing.

A random tiny target over 5 tokens, a corpus of random answers over the same 5 tokens (so every suffix has several
continuations that disagree), trees of up to 6 nodes. The exact joint of the first three tokens comes from the
target itself, as in test_sampling_distribution.py.
"""

import itertools

import numpy as np
import pytest
from scipy.stats import chisquare

from deepspec.decoding import SamplingParams, SpecEngine
from deepspec.decoding.drafters import corpus_tree
from deepspec.decoding.drafters.corpus_lookup import CorpusLookupDrafter
from deepspec.decoding.drafters.suffix_index import SEPARATOR, SuffixIndex
from tests.conftest import make_tiny_target
from tests.deepspec.decoding.exact_joint import exact_joint

VOCAB, PROMPT, N = 5, [1, 2, 3], 2000


@pytest.fixture(scope="module")
def target():
    return make_tiny_target(vocab_size=VOCAB, hidden=32, eos=False, seed=3, temperature=8.0)[0]


def _drafter(sampled: bool) -> CorpusLookupDrafter:
    rng = np.random.default_rng(0)
    corpus = []
    for _ in range(60):
        corpus += rng.choice(VOCAB, size=int(rng.integers(3, 9)), p=[0.1, 0.2, 0.2, 0.3, 0.2]).tolist() + [SEPARATOR]
    return CorpusLookupDrafter(
        SuffixIndex.build(np.array(corpus), max_match=4), tree=True, sampled=sampled, max_fallbacks=1
    )


def _p_value(target, drafter) -> float:
    engine = SpecEngine(
        target, drafter, max_batch_size=64, max_seq_len=32, num_speculative_tokens=6, max_verify_tokens=64 * 7
    )
    results = engine.generate([PROMPT] * N, [SamplingParams(max_tokens=3, temperature=1.0, seed=i) for i in range(N)])
    assert sum(r.num_draft_tokens for r in results) > N // 4  # speculation really happened
    counts = {(a, b, c): 0 for a, b, c in itertools.product(range(VOCAB), repeat=3)}
    for r in results:
        a, b, c = r.token_ids
        counts[a, b, c] += 1
    joint = exact_joint(target, PROMPT, VOCAB)
    cells = [c for c in counts if joint[c] * N >= 5]  # pool the rare cells into one
    observed = [counts[c] for c in cells] + [N - sum(counts[c] for c in cells)]
    expected = [joint[c] * N for c in cells] + [N - sum(joint[c] * N for c in cells)]
    return float(chisquare(observed, expected).pvalue)


@pytest.mark.parametrize("sampled", [True, False], ids=["sampled-q", "deterministic"])
def test_corpus_trees_sample_the_target_distribution(target, sampled):
    assert _p_value(target, _drafter(sampled)) > 1e-3


def test_the_check_rejects_corpus_trees_whose_q_is_a_lie(target, monkeypatch):
    """Children taken deterministically (the most frequent) but declared as drawn from the frequencies."""
    real_add = corpus_tree.TreeBuilder._add_child

    def add_top_claim_q(self, i, parent, score, source, feature):
        real_add(self, i, parent, score, source, feature)
        node = self.nodes[-1]
        if source != "context":
            children = parent.corpus[source]
            tokens = np.array(children.tokens, dtype=np.int64)
            probs = np.array(children.counts, dtype=np.float64)
            node.token, node.q = int(tokens[0]), (tokens, probs / probs.sum())

    monkeypatch.setattr(corpus_tree.TreeBuilder, "_add_child", add_top_claim_q)
    assert _p_value(target, _drafter(sampled=False)) < 1e-3


def test_greedy_corpus_trees_generate_what_the_target_alone_generates(target):
    prompts = [[1, 2, 3], [4, 0, 1, 2], [2, 2, 2, 2, 3]]
    params = [SamplingParams(max_tokens=12, temperature=0.0)] * len(prompts)
    alone = SpecEngine(target, None, max_batch_size=4, max_seq_len=32).generate(prompts, params)
    engine = SpecEngine(target, _drafter(sampled=True), max_batch_size=4, max_seq_len=32, num_speculative_tokens=6)
    with_trees = engine.generate(prompts, params)
    assert [r.token_ids for r in with_trees] == [r.token_ids for r in alone]
    assert sum(r.num_draft_tokens for r in with_trees) > 0
