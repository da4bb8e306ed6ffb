"""Chunked prefill across steps: while rows decode, a long prompt is prefilled at most `prefill_tokens_per_step` tokens
per step (vLLM's chunked prefill, vllm/v1/core/sched/scheduler.py `schedule`: a token budget per step shared by running
and new requests), so running streams keep getting tokens every step; outputs, the drafter's features and prompt
logprobs are exactly those of a whole prefill."""

from __future__ import annotations

import pytest
import torch

from deepspec.decoding.drafter import Drafter, KVDrafter
from deepspec.decoding.drafters.prompt_lookup import PromptLookupDrafter
from deepspec.decoding.engine import SpecEngine
from deepspec.decoding.params import SamplingParams
from deepspec.decoding.registry import load_checkpoint_drafter
from deepspec.models.drafts import save_draft
from tests.deepspec.decoding.checked import prompt_scores
from tests.training.helpers import tiny_draft, tiny_target

CHUNK = 8
LONG = [(7 * i + 3) % 60 for i in range(45)]  # 45 tokens: 6 chunks of 8
SHORT = [[1, 2, 3, 1, 2], [4, 5, 6], [9, 8, 7, 6]]
GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def eagle3_dir(target, tmp_path_factory):
    return save_draft(tiny_draft(target, "eagle3", draft_vocab_size=48), tmp_path_factory.mktemp("eagle3") / "d")


def _engine(target, drafter=None, chunk=CHUNK, batch=4):
    return SpecEngine(
        target,
        drafter,
        max_batch_size=batch,
        max_seq_len=128,
        num_speculative_tokens=3,
        prefill_chunk_size=512,
        prefill_tokens_per_step=chunk,
    )


def _run_with_late_long_prompt(engine, long_params=GREEDY, short_params=GREEDY):
    """Short requests decode for two steps, then the long prompt arrives. → (results by id, per step: which
    requests got tokens)."""
    for i, prompt in enumerate(SHORT):
        engine.add_request(f"s{i}", prompt, short_params, keep_result=True)
    steps = [engine.step(), engine.step()]
    engine.add_request("long", LONG, long_params, keep_result=True)
    while engine.has_unfinished():
        steps.append(engine.step())
    ids = [f"s{i}" for i in range(len(SHORT))] + ["long"]
    return {i: engine.pop_result(i) for i in ids}, [{o.request_id for o in outs if o.new_token_ids} for outs in steps]


def test_running_streams_get_a_token_every_step_while_a_long_prompt_prefills(target):
    results, steps = _run_with_late_long_prompt(_engine(target))
    first_long = next(i for i, got in enumerate(steps) if "long" in got)
    # 45 tokens at 8 a step: the long prompt's first token comes 6 steps after it arrived (step 2) ...
    assert first_long == 2 + 5
    # ... and meanwhile every short stream got tokens in every step
    assert all({"s0", "s1", "s2"} <= got for got in steps[2:first_long])
    whole = {
        i: r for i, r in zip(["s0", "s1", "s2", "long"], _engine(target, chunk=512).generate(SHORT + [LONG], GREEDY))
    }
    assert {i: r.token_ids for i, r in results.items()} == {i: r.token_ids for i, r in whole.items()}


def test_with_nothing_decoding_a_long_prompt_is_prefilled_in_one_step(target):
    engine = _engine(target)
    engine.add_request("long", LONG, GREEDY, keep_result=True)
    assert [o.request_id for o in engine.step()] == ["long"]


class _Recorder(KVDrafter):
    """Wraps a KV drafter and keeps what each slot was told when its prefill completed (`reset` then `commit`)."""

    def __init__(self, inner: Drafter):
        assert isinstance(inner, KVDrafter)
        self.inner, self.prefills, self._fresh = inner, [], set()
        self.name, self.feature_layers = inner.name, inner.feature_layers

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def bind(self, target, max_batch_size, max_seq_len):
        self.inner.bind(target, max_batch_size, max_seq_len)

    def reset(self, slot, first_token):
        self._fresh.add(slot)
        self.inner.reset(slot, first_token)

    def commit(self, slots, tokens, num_tokens, features):
        if len(slots) == 1 and slots[0] in self._fresh:
            self._fresh.discard(slots[0])
            self.prefills.append((tokens.clone(), None if features is None else features.clone()))
        self.inner.commit(slots, tokens, num_tokens, features)

    def propose(self, view, slots, k, sampling):
        return self.inner.propose(view, slots, k, sampling)

    def move_slot(self, src, dst):
        self.inner.move_slot(src, dst)

    def release(self, slot):
        self.inner.release(slot)


def test_the_drafter_gets_the_whole_prompts_features_after_a_chunked_prefill(target, eagle3_dir):
    chunked = _Recorder(load_checkpoint_drafter(eagle3_dir, target))
    results, _ = _run_with_late_long_prompt(_engine(target, chunked))
    whole = _Recorder(load_checkpoint_drafter(eagle3_dir, target))
    _engine(target, whole, chunk=512).generate([LONG], GREEDY)
    tokens, features = chunked.prefills[-1]  # the long prompt completes last
    assert torch.equal(tokens, whole.prefills[0][0]) and features.shape == whole.prefills[0][1].shape
    torch.testing.assert_close(features, whole.prefills[0][1], rtol=1e-5, atol=1e-5)
    assert results["long"].num_draft_tokens > 0


def test_prompt_logprobs_and_sampled_rows_across_steps(target):
    scored = SamplingParams(max_tokens=3, ignore_eos=True, prompt_logprobs=2, logprobs=1)
    results, _ = _run_with_late_long_prompt(_engine(target, PromptLookupDrafter()), long_params=scored)
    whole = _engine(target, chunk=512).generate([LONG], scored)[0]
    got = prompt_scores(results["long"])
    assert [lp.token_id for lp in got] == LONG[1:]
    for a, b in zip(got, prompt_scores(whole)):
        assert a.top_token_ids == b.top_token_ids and abs(a.logprob - b.logprob) < 1e-4
    assert results["long"].token_ids == whole.token_ids


def test_finished_and_aborted_rows_keep_the_prefilled_rows_in_front(target):
    """Rows leave while the long prompt is half prefilled, and a waiting request is aborted: every other request
    still ends exactly as alone."""
    engine = _engine(target, PromptLookupDrafter(), batch=4)
    engine.add_request("s0", SHORT[0], SamplingParams(max_tokens=3, ignore_eos=True), keep_result=True)
    engine.add_request("s1", SHORT[1], GREEDY, keep_result=True)
    engine.step()
    engine.add_request("long", LONG, GREEDY, keep_result=True)
    engine.add_request("gone", SHORT[2], GREEDY)
    engine.step()  # s0 finishes (3 tokens) while the long prompt is one chunk in
    assert engine.abort("gone")
    while engine.has_unfinished():
        engine.step()
        prefilled = [s.prefilled for s in engine._running]
        assert prefilled == sorted(prefilled, reverse=True)  # the prefilled rows come first
    alone = {
        name: _engine(target, chunk=512).generate([prompt], params)[0].token_ids
        for name, prompt, params in (
            ("s0", SHORT[0], SamplingParams(max_tokens=3, ignore_eos=True)),
            ("s1", SHORT[1], GREEDY),
            ("long", LONG, GREEDY),
        )
    }
    assert {name: engine.pop_result(name).token_ids for name in alone} == alone
