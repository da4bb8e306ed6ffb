"""Speculative sampling must draw from exactly the target's distribution (Leviathan/Chen rejection rule).

A vocabulary of 5 and a random tiny target give a joint of the first three generated tokens over 125 cells,
computed exactly from the model. 3,000 seeded generations land in those cells; a chi-square test at
alpha = 1e-3 must not reject. The seeds are fixed, so the test is deterministic, and the last test shows it
has teeth: a verifier that accepts every draft is rejected by the same check.
"""

import itertools

import pytest
import torch
from scipy.stats import chisquare

from deepspec.decoding import SamplingParams, SpecEngine
from deepspec.decoding import engine as engine_module
from deepspec.decoding.drafters.random import RandomDrafter
from plugins import process_logits as sampling_probs
from tests.conftest import make_tiny_target

VOCAB, PROMPT, N = 5, [1, 2, 3], 3000


@pytest.fixture(scope="module")
def target():
    return make_tiny_target(vocab_size=VOCAB, hidden=32, eos=False, seed=3, temperature=8.0)[0]


def _exact_joint(target, params: SamplingParams) -> dict[tuple, float]:
    def probs(ctx):
        logits = target.forward(torch.tensor([ctx]), torch.tensor([0])).logits[:, -1:]
        return sampling_probs(logits, torch.tensor([params.temperature]), torch.tensor([params.top_k]),
                              torch.tensor([params.top_p]))[0, 0]

    joint = {}
    with torch.no_grad():
        p1 = probs(PROMPT)
        for a in range(VOCAB):
            p2 = probs(PROMPT + [a])
            for b in range(VOCAB):
                p3 = probs(PROMPT + [a, b])
                for c in range(VOCAB):
                    joint[(a, b, c)] = float(p1[a] * p2[b] * p3[c])
    return joint


def _p_value(target, drafter, params: SamplingParams) -> float:
    # the verification budget off: it could decide that drafting does not pay, and this test is about the drafts
    engine = SpecEngine(target, drafter, max_batch_size=64, max_seq_len=32, num_speculative_tokens=3,
                        max_verify_tokens=64 * 4, verify_budget=False)
    runs = [SamplingParams(max_tokens=3, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                           seed=i) for i in range(N)]
    results = engine.generate([PROMPT] * N, runs)
    assert sum(r.num_draft_tokens for r in results) > N // 4  # speculation really happened
    counts = {cell: 0 for cell in itertools.product(range(VOCAB), repeat=3)}
    for r in results:
        counts[tuple(r.token_ids)] += 1
    joint = _exact_joint(target, params)
    cells = [c for c in counts if joint[c] * N >= 5]  # pool the rare cells into one
    observed = [counts[c] for c in cells] + [N - sum(counts[c] for c in cells)]
    expected = [joint[c] * N for c in cells] + [N - sum(joint[c] * N for c in cells)]
    return float(chisquare(observed, expected).pvalue)


@pytest.mark.parametrize("with_probs", [True, False], ids=["drafts-with-q", "deterministic-drafts"])
def test_speculative_sampling_matches_target_distribution(target, with_probs):
    drafter = RandomDrafter(VOCAB, seed=7, sample_probs=with_probs)
    assert _p_value(target, drafter, SamplingParams(temperature=1.0)) > 1e-3


def test_filtered_sampling_matches_filtered_target(target):
    params = SamplingParams(temperature=0.7, top_k=3, top_p=0.9)
    assert _p_value(target, RandomDrafter(VOCAB, seed=2, sample_probs=True), params) > 1e-3


def test_the_check_rejects_a_verifier_that_accepts_everything(target, monkeypatch):
    real_verify = engine_module.verify

    def accept_all(drafts, num_drafts, logits, draft_probs, sampling):
        after_block = logits[torch.arange(logits.shape[0]), num_drafts][:, None]
        bonus = real_verify(drafts[:, :0], torch.zeros_like(num_drafts), after_block, None, sampling)[1]
        return num_drafts, bonus

    monkeypatch.setattr(engine_module, "verify", accept_all)
    assert _p_value(target, RandomDrafter(VOCAB, seed=7, sample_probs=True), SamplingParams(temperature=1.0)) < 1e-3
