"""Engine behaviour on a tiny random target: exactness of greedy speculation, batching, stops, bad input."""

import pytest
import torch

from deepspec.decoding import EngineFullError, RequestError, RequestErrorCode, SamplingParams, SpecEngine
from deepspec.decoding.drafters.prompt_lookup import PromptLookupDrafter
from deepspec.decoding.drafters.random import RandomDrafter
from deepspec.decoding.prefill_plan import split_padded_batch
from tests.conftest import make_tiny_target

PROMPTS = [[1, 2, 3, 1, 2], [4, 5, 6, 7, 8, 9, 10, 4, 5], [3], [7, 7, 7, 7, 7, 7], [2, 11, 2, 11, 2], [9, 8, 7]]


@pytest.fixture(scope="module")
def target():
    return make_tiny_target(eos=False, temperature=4.0)[0]


def _run(target, drafter, prompts, max_batch_size, **params):
    engine = SpecEngine(target, drafter, max_batch_size=max_batch_size, max_seq_len=128, num_speculative_tokens=4)
    return engine.generate(prompts, SamplingParams(max_tokens=24, **params))


def test_greedy_speculation_is_token_identical_to_target_only(target):
    reference = [r.token_ids for r in _run(target, None, PROMPTS, 1)]
    for drafter in (PromptLookupDrafter(min_ngram=1, max_ngram=3), RandomDrafter(16, seed=1)):
        for batch in (1, 3, 8):  # 3 < len(PROMPTS): requests join and leave mid-run (slot compaction)
            got = [r.token_ids for r in _run(target, drafter, PROMPTS, batch)]
            assert got == reference, (drafter.name, batch)


def test_uneven_acceptance_in_one_batch_is_counted_per_row(target):
    results = _run(target, PromptLookupDrafter(min_ngram=1, max_ngram=3), PROMPTS, 8)
    accepted = [r.num_accepted_tokens for r in results]
    assert len(set(accepted)) > 1  # rows really accepted different amounts in shared rounds
    for r in results:
        assert len(r.token_ids) == 24
        assert r.num_steps + r.num_accepted_tokens == 24 - 1  # the first token comes from prefill
        assert sum(r.accepted_per_position) == r.num_accepted_tokens
        assert all(a <= p for a, p in zip(r.accepted_per_position, r.proposed_per_position))


def test_verify_budget_shortens_blocks_of_large_batches(target):
    # the timed budget off: this checks the token cap alone (the timed one may decide not to draft on a busy CPU)
    engine = SpecEngine(
        target, RandomDrafter(16), max_batch_size=6, max_seq_len=128, num_speculative_tokens=4, max_verify_tokens=12
    )
    outputs = []
    engine.generate(PROMPTS, SamplingParams(max_tokens=8), on_output=outputs.append)
    assert max(o.num_draft_tokens for o in outputs) <= 12 // 6 - 1
    assert sum(o.num_draft_tokens for o in outputs) > 0


@pytest.mark.parametrize(
    "lengths, runs",
    [
        ([449] + [100] * 19, [(0, 1), (1, 20)]),  # one long prompt gets its own forward
        ([100] * 5, [(0, 5)]),  # equal prompts stay one batch
        ([40, 5, 40, 30], [(0, 4)]),  # padding 45 tokens is cheaper than another forward
        ([], []),
    ],
)
def test_prefill_batches_are_cut_where_padding_costs_more_than_a_forward(lengths, runs):
    assert split_padded_batch(lengths, forward_cost=32) == runs


def test_mixed_prompt_lengths_prefill_in_separate_forwards_with_unchanged_output(target):
    long = list(range(1, 15)) * 6  # 84 tokens: padding the three short prompts to it costs more than a forward
    prompts = [long] + PROMPTS[:3]
    widths = []
    forward = target.forward
    target.forward = lambda tokens, *a, **k: widths.append(tokens.shape) or forward(tokens, *a, **k)
    try:
        batched = [r.token_ids for r in _run(target, None, prompts, 4)]
    finally:
        del target.forward
    assert widths[:2] == [(1, 84), (3, 9)]  # the prefill: the long prompt alone, then the short ones together
    assert batched == [r.token_ids for p in prompts for r in _run(target, None, [p], 1)]


def test_streamed_chunks_reassemble_the_result(target):
    chunks: dict[str, list[int]] = {}
    engine = SpecEngine(target, RandomDrafter(16), max_batch_size=2, max_seq_len=128, num_speculative_tokens=3)
    results = engine.generate(
        PROMPTS[:3],
        SamplingParams(max_tokens=10),
        on_output=lambda o: chunks.setdefault(o.request_id, []).extend(o.new_token_ids),
    )
    for r in results:
        assert chunks[r.request_id] == r.token_ids


def test_eos_stops_and_is_not_returned():
    target = make_tiny_target(eos=True, temperature=4.0)[0]
    eos = target.eos_token_ids[0]
    free = _run(make_tiny_target(eos=False, temperature=4.0)[0], None, PROMPTS, 8)
    stopped = _run(target, PromptLookupDrafter(1, 3), PROMPTS, 8)
    for f, s in zip(free, stopped):
        if eos in f.token_ids:
            assert s.token_ids == f.token_ids[: f.token_ids.index(eos)] and s.finish_reason == "stop"
        else:
            assert s.token_ids == f.token_ids and s.finish_reason == "length"


def test_stop_string_truncates_output(target):
    free = _run(target, None, PROMPTS[:1], 1)[0]
    stop = free.text[5:7]
    cut = _run(target, RandomDrafter(16), PROMPTS[:1], 1, stop=(stop,))[0]
    assert cut.finish_reason == "stop"
    assert cut.text == free.text[: free.text.index(stop)]


def test_abort_frees_the_slot(target):
    engine = SpecEngine(target, None, max_batch_size=1, max_seq_len=128)
    engine.add_request("a", [1, 2, 3], SamplingParams(max_tokens=50))
    with pytest.raises(EngineFullError):
        engine.add_request("b", [1, 2, 3], SamplingParams(max_tokens=50))
    engine.step()
    assert engine.abort("a") and engine.num_free_slots == 1 and not engine.abort("a")
    engine.add_request("b", [1, 2, 3], SamplingParams(max_tokens=2))
    outs = engine.step()
    assert outs[0].request_id == "b" and outs[0].finished


@pytest.mark.parametrize(
    "make, code, message",
    [
        (lambda: SamplingParams(max_tokens=0), RequestErrorCode.MAX_TOKENS_INVALID, "max_tokens"),
        (lambda: SamplingParams(max_tokens=-3), RequestErrorCode.MAX_TOKENS_INVALID, "max_tokens"),
        (lambda: SamplingParams(max_tokens=True), RequestErrorCode.MAX_TOKENS_INVALID, "max_tokens"),
        (lambda: SamplingParams(temperature=-0.1), RequestErrorCode.SAMPLING_INVALID, "temperature"),
        (lambda: SamplingParams(temperature=float("nan")), RequestErrorCode.SAMPLING_INVALID, "temperature"),
        (lambda: SamplingParams(temperature=float("inf")), RequestErrorCode.SAMPLING_INVALID, "temperature"),
        (lambda: SamplingParams(top_p=0.0), RequestErrorCode.SAMPLING_INVALID, "top_p"),
        (lambda: SamplingParams(top_p=float("nan")), RequestErrorCode.SAMPLING_INVALID, "top_p"),
        (lambda: SamplingParams(top_k=-1), RequestErrorCode.SAMPLING_INVALID, "top_k"),
        (lambda: SamplingParams(stop=("",)), RequestErrorCode.SAMPLING_INVALID, "stop"),
        (lambda: SamplingParams(seed=-1), RequestErrorCode.SAMPLING_INVALID, "seed"),
        (lambda: SamplingParams(seed=2**64), RequestErrorCode.SAMPLING_INVALID, "seed"),
        (
            lambda: SamplingParams(seed=1.5),  # pyright: ignore[reportArgumentType]  # the bad input under test
            RequestErrorCode.SAMPLING_INVALID,
            "seed",
        ),
    ],
)
def test_bad_sampling_params_are_refused_with_a_code(make, code, message):
    with pytest.raises(RequestError, match=message) as info:
        make()
    assert info.value.code is code and isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "prompt, max_tokens, code, message",
    [
        ([], 4, RequestErrorCode.PROMPT_EMPTY, "prompt is empty"),
        (list(range(10)) * 13, 4, RequestErrorCode.CONTEXT_TOO_LONG, "context length is 128 tokens and the prompt"),
        ([1, 2], 200, RequestErrorCode.CONTEXT_TOO_LONG, "lower max_tokens to at most 126"),
        ([1, 2], 126, None, None),  # exactly fills the window: accepted
        ([1, 99], 4, RequestErrorCode.PROMPT_TOKEN_INVALID, "token ids"),
        ([1, 2.0], 4, RequestErrorCode.PROMPT_TOKEN_INVALID, "token ids"),
    ],
)
def test_bad_requests_are_refused_with_a_code(target, prompt, max_tokens, code, message):
    engine = SpecEngine(target, None, max_batch_size=1, max_seq_len=128)
    if code is None:
        engine.add_request("x", prompt, SamplingParams(max_tokens=max_tokens))
        assert engine.num_free_slots == 0
        return
    with pytest.raises(RequestError, match=message) as info:
        engine.add_request("x", prompt, SamplingParams(max_tokens=max_tokens))
    assert info.value.code is code
    assert engine.num_free_slots == 1


def test_a_running_request_id_is_refused_with_a_code(target):
    engine = SpecEngine(target, None, max_batch_size=2, max_seq_len=128)
    engine.add_request("a", [1, 2], SamplingParams(max_tokens=4))
    with pytest.raises(RequestError) as info:
        engine.add_request("a", [3], SamplingParams(max_tokens=4))
    assert info.value.code is RequestErrorCode.REQUEST_ID_IN_USE and engine.num_running == 1


def test_a_target_with_its_own_thread_pool_steps_with_one_torch_thread_and_gets_the_count_back(target):
    """OnnxTarget's `host_threads`: torch's OpenMP workers would spin on the cores the target's own pool needs."""
    import copy

    seen = []

    class OwnPool(type(target)):
        host_threads = 1

        def forward(self, *args, **kwargs):
            seen.append(torch.get_num_threads())
            return super().forward(*args, **kwargs)

    own_pool = copy.copy(target)
    own_pool.__class__ = OwnPool
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        plain = [r.token_ids for r in _run(target, None, PROMPTS[:2], 2, temperature=1.0, seed=3)]
        engine = SpecEngine(
            own_pool, RandomDrafter(16, seed=1), max_batch_size=2, max_seq_len=128, num_speculative_tokens=4
        )
        seen.clear()  # the engine's start-up timing probe runs outside a step, with torch's own threads
        got = [r.token_ids for r in engine.generate(PROMPTS[:2], SamplingParams(max_tokens=24))]
        assert seen and set(seen) == {1}
        assert torch.get_num_threads() == 2  # restored after every step
        assert [r.token_ids for r in _run(own_pool, None, PROMPTS[:2], 2, temperature=1.0, seed=3)] == plain
        assert got == [r.token_ids for r in _run(target, None, PROMPTS[:2], 2)]
    finally:
        torch.set_num_threads(before)
