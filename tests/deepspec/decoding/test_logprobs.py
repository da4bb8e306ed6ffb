"""Logprobs from the verify pass and prompt scoring, against Hugging Face's log_softmax of the same target (fp32).

The reference is what lm-eval and vLLM compute: `torch.log_softmax(model(ids).logits, -1)` of the transformers
model over the whole sequence (prompt + output), read at the position before each token; the top-N alternatives
are that row's `topk`. Every drafter shape the engine verifies is covered (none, a prompt-lookup chain, a random
chain, a random tree through tree attention), greedy and sampled, with a batch whose rows accept different numbers
of drafts in one pass.
"""

from typing import Any

import pytest
import torch

from deepspec.decoding import RequestError, SamplingParams, SpecEngine
from deepspec.decoding.drafters.prompt_lookup import PromptLookupDrafter
from deepspec.decoding.drafters.random import RandomDrafter
from deepspec.decoding.logprobs import MAX_TOP_LOGPROBS
from tests.conftest import make_tiny_target
from tests.deepspec.decoding.checked import logprobs_of, prompt_scores

PROMPTS = [[1, 2, 3, 4, 1, 2, 3], [5, 6, 7], [8, 9, 10, 11, 12, 8, 9, 10, 11], [3, 3, 3, 3]]
NUM_TOP = 3
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def tiny():
    return make_tiny_target()


def _drafter(name: str):
    if name == "prompt-lookup":
        return PromptLookupDrafter(min_ngram=1, max_ngram=3)
    if name == "random":
        return RandomDrafter(16, seed=1)
    if name == "random-tree":
        return RandomDrafter(16, seed=1, tree=True)
    return None


def _hf_logprobs(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)  # [T, V]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("drafter_name", ["none", "prompt-lookup", "random", "random-tree"])
def test_emitted_logprobs_equal_hf_log_softmax(tiny, drafter_name, temperature):
    target, hf = tiny
    engine = SpecEngine(target, _drafter(drafter_name), max_batch_size=4, max_seq_len=128, num_speculative_tokens=4)
    params = SamplingParams(max_tokens=12, temperature=temperature, seed=14, ignore_eos=True, logprobs=NUM_TOP)
    results = engine.generate(PROMPTS, params)
    if drafter_name == "prompt-lookup":  # accepted drafts' logprobs come from inside the verify block
        assert sum(r.num_accepted_tokens for r in results) > 0
    for prompt, result in zip(PROMPTS, results):
        assert len(logprobs_of(result)) == len(result.token_ids) == 12
        reference = _hf_logprobs(hf, prompt + result.token_ids)
        for j, (token, lp) in enumerate(zip(result.token_ids, logprobs_of(result))):
            row = reference[len(prompt) - 1 + j]
            assert lp.token_id == token
            assert abs(lp.logprob - float(row[token])) < TOLERANCE
            top = row.topk(NUM_TOP)
            assert list(lp.top_token_ids) == top.indices.tolist()
            assert torch.allclose(torch.tensor(lp.top_logprobs), top.values, atol=TOLERANCE)


def test_rows_without_logprobs_get_none_and_mixed_widths_are_cut(tiny):
    target, _ = tiny
    engine = SpecEngine(target, PromptLookupDrafter(1, 3), max_batch_size=4, max_seq_len=128)
    params = [SamplingParams(max_tokens=6, ignore_eos=True, logprobs=n) for n in (None, 0, 1, 5)]
    results = engine.generate(PROMPTS, params)
    assert results[0].logprobs is None
    assert [len(lp.top_token_ids) for lp in logprobs_of(results[1])] == [0] * 6
    assert [len(lp.top_token_ids) for lp in logprobs_of(results[2])] == [1] * 6
    assert [len(lp.top_token_ids) for lp in logprobs_of(results[3])] == [5] * 6


def test_streamed_step_outputs_carry_logprobs_aligned_with_tokens(tiny):
    target, _ = tiny
    engine = SpecEngine(target, PromptLookupDrafter(1, 3), max_batch_size=2, max_seq_len=128)
    chunks = []
    result = engine.generate(
        PROMPTS[:1], SamplingParams(max_tokens=10, ignore_eos=True, logprobs=0), on_output=chunks.append
    )[0]
    assert all(len(c.logprobs) == len(c.new_token_ids) for c in chunks)
    assert [lp for c in chunks for lp in c.logprobs] == result.logprobs


@pytest.mark.parametrize("chunk_size", [512, 3])
def test_prompt_scoring_with_max_tokens_0_equals_hf(tiny, chunk_size):
    """echo + logprobs + max_tokens 0: one prefill scores the prompt; the first token has nothing predicting it
    (None, as vLLM's prompt_logprobs), and nothing is generated. A chunk size of 3 splits the prompts' prefill."""
    target, hf = tiny
    engine = SpecEngine(target, None, max_batch_size=4, max_seq_len=128, prefill_chunk_size=chunk_size)
    params = [
        SamplingParams(max_tokens=0, prompt_logprobs=2),
        SamplingParams(max_tokens=3, logprobs=1),
        SamplingParams(max_tokens=0, prompt_logprobs=0),
        SamplingParams(max_tokens=2, prompt_logprobs=1, ignore_eos=True),
    ]
    results = engine.generate(PROMPTS, params)
    assert results[0].token_ids == [] and results[0].finish_reason == "length" and results[0].text == ""
    assert results[1].prompt_logprobs is None and len(results[1].token_ids) > 0
    for i in (0, 2, 3):
        prompt, scores = PROMPTS[i], prompt_scores(results[i])  # scores[p - 1]: prompt position p
        reference = _hf_logprobs(hf, prompt)
        assert len(scores) == len(prompt) - 1
        num_top = params[i].prompt_logprobs
        assert num_top is not None
        for p in range(1, len(prompt)):
            assert scores[p - 1].token_id == prompt[p]
            assert abs(scores[p - 1].logprob - float(reference[p - 1, prompt[p]])) < TOLERANCE
            top = reference[p - 1].topk(num_top)
            assert list(scores[p - 1].top_token_ids) == top.indices.tolist()
    assert len(results[3].token_ids) == 2


def _processed_reference(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """log of the distribution vLLM's sampler draws from (vllm/v1/sample/sampler.py: temperature, then top-k, then
    top-p over what top-k kept, the nucleus the smallest prefix whose mass reaches top_p), written out on its own."""
    z = logits.float() / (temperature if temperature > 0 else 1.0)
    if top_k:
        z = z.masked_fill(z < z.topk(top_k).values[-1], float("-inf"))
    ordered, order = z.sort(descending=True)
    probs = torch.softmax(ordered, -1)
    drop = (probs.cumsum(-1) - probs) >= top_p
    drop[0] = False
    z = z.clone()
    z[order[drop]] = float("-inf")
    return torch.log_softmax(z, -1)


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(0.7, 0, 1.0), (1.3, 5, 0.9), (0.0, 4, 1.0)])
def test_processed_logprobs_are_of_the_distribution_sampled_from(tiny, temperature, top_k, top_p):
    """logprobs_mode processed_logprobs (vLLM's name): the logprobs of the distribution each token was sampled from,
    at temperature 1 for greedy; tokens outside top-k / top-p are -inf; raw stays the model's."""
    target, hf = tiny
    engine = SpecEngine(target, _drafter("prompt-lookup"), max_batch_size=4, max_seq_len=128, num_speculative_tokens=4)
    common: dict[str, Any] = dict(
        max_tokens=10, temperature=temperature, top_k=top_k, top_p=top_p, seed=3, ignore_eos=True, logprobs=NUM_TOP
    )
    processed, raw = engine.generate(
        [PROMPTS[0]] * 2, [SamplingParams(**common, logprobs_mode="processed_logprobs"), SamplingParams(**common)]
    )
    assert processed.token_ids == raw.token_ids  # the mode changes what is reported, never what is sampled
    logits = hf(torch.tensor([PROMPTS[0] + processed.token_ids])).logits[0].detach()
    for j, (lp, raw_lp) in enumerate(zip(logprobs_of(processed), logprobs_of(raw))):
        row = logits[len(PROMPTS[0]) - 1 + j]
        reference = _processed_reference(row, temperature, top_k, top_p)
        assert abs(lp.logprob - float(reference[lp.token_id])) < TOLERANCE
        assert abs(raw_lp.logprob - float(torch.log_softmax(row.float(), -1)[lp.token_id])) < TOLERANCE
        finite = reference[torch.isfinite(reference)]
        kept = min(NUM_TOP, finite.numel())
        assert torch.allclose(
            torch.tensor(lp.top_logprobs[:kept]), finite.sort(descending=True).values[:kept], atol=TOLERANCE
        )
        assert all(v == float("-inf") for v in lp.top_logprobs[kept:])


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(logprobs=MAX_TOP_LOGPROBS + 1),
        dict(logprobs=-1),
        dict(prompt_logprobs=True),
        dict(max_tokens=0),
        dict(logprobs_mode="raw_logits"),
    ],
)
def test_bad_logprob_requests_are_refused(kwargs):
    with pytest.raises(RequestError):
        SamplingParams(**kwargs)
