"""Several sequences from one prompt (OpenAI's `n`): a fork shares its parent's prefill (vLLM's parallel sampling,
vllm/v1/engine/parallel_sampling.py, makes n child requests of one prompt and lets the prefix cache share its
blocks; here the parent's KV entries are copied into the fork's slot). The prompt is run once, each fork samples
and drafts on its own, and its tokens are exactly those of the same request run alone."""

from __future__ import annotations

import pytest

from deepspec.decoding.drafters.prompt_lookup import PromptLookupDrafter
from deepspec.decoding.engine import EngineFullError, SpecEngine
from deepspec.decoding.params import SamplingParams
from deepspec.decoding.registry import load_checkpoint_drafter
from deepspec.models.drafts import save_draft
from tests.deepspec.decoding.checked import logprobs_of, prompt_scores
from tests.training.helpers import tiny_draft, tiny_target

PROMPT = [(5 * i + 2) % 60 for i in range(20)]
OTHER = [3, 1, 4, 1, 5, 9, 2, 6]


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def eagle3_dir(target, tmp_path_factory):
    return save_draft(tiny_draft(target, "eagle3", draft_vocab_size=48), tmp_path_factory.mktemp("eagle3") / "d")


def _engine(target, drafter=None, batch=6, chunk=512):
    return SpecEngine(
        target,
        drafter,
        max_batch_size=batch,
        max_seq_len=128,
        num_speculative_tokens=3,
        prefill_chunk_size=8,
        prefill_tokens_per_step=chunk,
    )


def _sampled(seed: int) -> SamplingParams:
    return SamplingParams(max_tokens=10, temperature=1.0, seed=seed, ignore_eos=True, logprobs=1, prompt_logprobs=1)


def _alone(target, drafter, params: SamplingParams):
    return _engine(target, drafter).generate([PROMPT], params)[0]


def _run(engine):
    while engine.has_unfinished():
        engine.step()


@pytest.mark.parametrize("draft", ["none", "prompt_lookup", "eagle3"])
def test_forks_cost_one_prefill_and_each_equals_its_request_alone(target, eagle3_dir, draft):
    def drafter():
        return {
            "none": None,
            "prompt_lookup": PromptLookupDrafter(),
            "eagle3": load_checkpoint_drafter(eagle3_dir, target) if draft == "eagle3" else None,
        }[draft]

    engine = _engine(target, drafter())
    engine.add_request("c0", PROMPT, _sampled(7), keep_result=True)
    for i in (1, 2, 3):
        engine.add_request(f"c{i}", PROMPT, _sampled(7 + i), keep_result=True, fork_of="c0")
    assert engine.num_free_slots == 2
    _run(engine)
    assert engine.prompt_tokens_computed == len(PROMPT)
    results = [engine.pop_result(f"c{i}") for i in range(4)]
    assert len({tuple(r.token_ids) for r in results}) > 1  # four seeds, four samples
    for i, result in enumerate(results):
        alone = _alone(target, drafter(), _sampled(7 + i))
        assert result.token_ids == alone.token_ids
        assert [lp.token_id for lp in prompt_scores(result)] == PROMPT[1:]
        assert [round(lp.logprob, 4) for lp in logprobs_of(result)] == [
            round(lp.logprob, 4) for lp in logprobs_of(alone)
        ]


def test_forks_behind_a_chunked_prefill_and_between_waiting_requests_keep_every_request_exact(target):
    """A fork family arrives while rows decode (its prompt is prefilled in chunks across steps) with one more
    request waiting behind it: placing the forks shifts that request's slot, and every output still equals its
    request run alone."""
    greedy = SamplingParams(max_tokens=8, ignore_eos=True)
    engine = _engine(target, PromptLookupDrafter(), chunk=6)
    engine.add_request("run", OTHER, greedy, keep_result=True)
    engine.step()
    engine.add_request("p", PROMPT, _sampled(1), keep_result=True)
    engine.add_request("p1", PROMPT, _sampled(2), keep_result=True, fork_of="p")
    engine.add_request("after", OTHER[::-1], greedy, keep_result=True)
    _run(engine)
    assert engine.prompt_tokens_computed == len(OTHER) * 2 + len(PROMPT)
    alone = _engine(target, PromptLookupDrafter())
    assert engine.pop_result("run").token_ids == alone.generate([OTHER], greedy)[0].token_ids
    assert engine.pop_result("after").token_ids == alone.generate([OTHER[::-1]], greedy)[0].token_ids
    for rid, seed in (("p", 1), ("p1", 2)):
        assert engine.pop_result(rid).token_ids == _alone(target, PromptLookupDrafter(), _sampled(seed)).token_ids


def test_a_fork_of_an_aborted_parent_prefills_on_its_own(target):
    engine = _engine(target)
    engine.add_request("p", PROMPT, _sampled(1))
    engine.add_request("p1", PROMPT, _sampled(2), keep_result=True, fork_of="p")
    engine.add_request("p2", PROMPT, _sampled(3), keep_result=True, fork_of="p")
    assert engine.abort("p2") and engine.abort("p")
    _run(engine)
    assert engine.pop_result("p2").finish_reason == "abort"
    assert engine.pop_result("p1").token_ids == _alone(target, None, _sampled(2)).token_ids
    assert engine.num_free_slots == engine.max_batch_size


def test_forks_are_refused_when_they_cannot_share(target):
    engine = _engine(target, batch=3)
    with pytest.raises(ValueError, match="no such request"):
        engine.add_request("x", PROMPT, _sampled(1), fork_of="missing")
    engine.add_request("p", PROMPT, _sampled(1))
    with pytest.raises(ValueError, match="differs"):
        engine.add_request("x", OTHER, _sampled(1), fork_of="p")
    engine.add_request("p1", PROMPT, _sampled(2), fork_of="p")
    with pytest.raises(ValueError, match="not itself a fork"):
        engine.add_request("y", PROMPT, _sampled(1), fork_of="p1")
    engine.add_request("p2", PROMPT, _sampled(3), fork_of="p")
    with pytest.raises(EngineFullError):  # waiting forks hold their slots
        engine.add_request("p3", PROMPT, _sampled(4), fork_of="p")
    engine.step()
    engine.abort("p1")
    with pytest.raises(ValueError, match="prefill is complete"):
        engine.add_request("p3", PROMPT, _sampled(4), fork_of="p")
