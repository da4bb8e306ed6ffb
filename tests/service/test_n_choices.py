"""`n` choices through the gateway (OpenAI's `n`): the real gateway, in this process, in front of a fake KServe worker
(tests/service/fake_worker.py) that answers as deepspec_protocol/worker.py ("Several choices") says a worker does, and
in front of a model that takes one sequence per request, which the dispatcher fans out (service/gateway/fanout.py).

The rules held are OpenAI's and vLLM's: a request's choices are numbered 0..n-1, and in a batch of prompts prompt i's
choice j is i * n + j (vllm-project/vllm vllm/entrypoints/openai/serving_completion.py, `i * num_choices + output.
index`); the usage counts each prompt once and the completion tokens of every choice (serving_chat.py and
serving_completion.py sum `len(output.token_ids)` over the outputs and take `len(prompt_token_ids)` once); streamed,
chat opens every choice with its role chunk (serving_chat.py `for i in range(num_choices)`); a fanned-out child i is
seeded seed + i (vllm/v1/engine/parallel_sampling.py ParentRequest.get_child_info / `_get_child_sampling_params`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import grpc
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client import generate_latest

from deepspec_protocol import worker as p
from deepspec_protocol.protos.deepspec.v1 import completions_pb2 as pb
from deepspec_protocol.protos.deepspec.v1 import completions_pb2_grpc as pb_grpc
from service.gateway.fanout import child_requests, fan_out
from service.gateway.worker_client import Chunk, GenerationRequest, WorkerError, total_stats
from service.metrics import GENERATION_TOKENS_TOTAL, PROMPT_TOKENS_TOTAL, REQUEST_SUCCESS_TOTAL
from tests.service.conftest import Gateway, Worker, in_process_gateway, metric_value
from tests.service.fake_worker import MODEL, FakeWorker, finish_reason, words
from tests.service.test_openai_client import _client, _collect, _sse

CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]


@contextlib.asynccontextmanager
async def _gateway(worker: FakeWorker):
    """(an openai client of the in-process gateway, its state) in front of `worker`."""
    address = await worker.start()
    try:
        async with in_process_gateway(address, "the fake worker") as (http, state):
            yield (
                # openai takes an httpx client as well as an httpx2 one (openai/_httpx2.py) but declares only httpx2's
                openai.AsyncOpenAI(
                    base_url="http://gateway/v1",
                    api_key="unused",
                    max_retries=0,
                    http_client=http,  # pyright: ignore[reportArgumentType]
                ),
                state,
            )
    finally:
        await worker.stop()


def _run(scenario, takes_n: bool = True):
    """(the fake worker, what `scenario(openai client, gateway state)` returned)."""
    worker = FakeWorker(takes_n)

    async def main():
        async with _gateway(worker) as (client, state):
            return await scenario(client, state)

    return worker, asyncio.run(main())


def _text(seed: int, max_tokens: int) -> str:
    return "".join(words(seed, max_tokens))


def _metric(state, name: str) -> float:
    return metric_value(generate_latest(state.metrics.registry).decode(), name)


@pytest.mark.parametrize("takes_n", [True, False], ids=["forked", "fanned-out"])
def test_chat_n3_whole_answers_three_choices_and_counts_the_prompt_once(takes_n):
    """Native: one worker request with num_return_sequences 3 (the prompt prefilled once). Fanned out: three requests
    without it, seeded 10, 11, 12, ids of their own; both read the same, since the worker seeds sequence i seed + i."""

    async def scenario(client, state):
        completion = await client.chat.completions.create(model=MODEL, messages=CHAT, n=3, seed=10, max_tokens=4)
        return completion, {
            name: _metric(state, name) for name in (PROMPT_TOKENS_TOTAL, GENERATION_TOKENS_TOTAL, REQUEST_SUCCESS_TOTAL)
        }

    worker, (completion, metrics) = _run(scenario, takes_n)
    assert [c.index for c in completion.choices] == [0, 1, 2]  # the worker answered them shortest first
    assert [c.message.content for c in completion.choices] == [_text(10 + i, 4) for i in range(3)]
    assert [c.finish_reason for c in completion.choices] == [finish_reason(10 + i) for i in range(3)]
    num_output = sum(len(words(10 + i, 4)) for i in range(3))
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (len("hello"), num_output)
    assert metrics == {
        PROMPT_TOKENS_TOTAL: len("hello"),
        GENERATION_TOKENS_TOTAL: num_output,
        REQUEST_SUCCESS_TOTAL: 1,
    }  # one request, whatever its n
    if takes_n:
        (request,) = worker.requests
        assert request[p.NUM_RETURN_SEQUENCES] == [3] and request[p.SEED] == [10]
    else:
        assert [r[p.SEED] for r in worker.requests] == [[10], [11], [12]]
        assert not any(p.NUM_RETURN_SEQUENCES in r for r in worker.requests)


@pytest.mark.parametrize("takes_n", [True, False], ids=["forked", "fanned-out"])
def test_completions_n2_streamed_interleave_and_each_choice_finishes(takes_n):
    async def scenario(client, state):
        stream = await client.completions.create(
            model=MODEL, prompt="hi", n=2, seed=10, max_tokens=3, stream=True, stream_options={"include_usage": True}
        )
        return [event async for event in stream]

    _, events = _run(scenario, takes_n)
    *chunks, last = events
    assert all(len(e.choices) == 1 for e in chunks) and last.choices == []
    for index in (0, 1):
        mine = [e.choices[0] for e in chunks if e.choices[0].index == index]
        assert "".join(c.text for c in mine) == _text(10 + index, 3)
        assert [c.finish_reason for c in mine] == [None] * (len(mine) - 1) + [finish_reason(10 + index)]
    if takes_n:  # the worker's interleaving passes through as it came
        assert [e.choices[0].index for e in chunks] == [0, 1, 0, 1, 0]
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (2, 3 + 2)


def test_chat_stream_opens_every_choice_with_its_role_and_carries_each_choices_logprobs():
    async def scenario(client, state):
        stream = await client.chat.completions.create(
            model=MODEL, messages=CHAT, n=3, seed=1, max_tokens=3, stream=True, logprobs=True
        )
        return [event.choices[0] async for event in stream]

    _, choices = _run(scenario)
    assert [(c.index, c.delta.role) for c in choices[:3]] == [(0, "assistant"), (1, "assistant"), (2, "assistant")]
    for index in range(3):
        mine = [c for c in choices[3:] if c.index == index]
        assert "".join(c.delta.content or "" for c in mine) == _text(1 + index, 3)
        assert "".join(t.token for c in mine for t in c.logprobs.content) == _text(1 + index, 3)


def test_a_batch_of_prompts_numbers_prompt_is_choice_j_i_times_n_plus_j():
    async def scenario(client, state):
        return await client.completions.create(model=MODEL, prompt=["ab", "cde"], n=2, seed=10, max_tokens=2)

    worker, completion = _run(scenario)
    assert [c.index for c in completion.choices] == [0, 1, 2, 3]
    assert [c.text for c in completion.choices] == [_text(10 + j, 2) for _ in range(2) for j in range(2)]
    assert completion.usage.prompt_tokens == len("ab") + len("cde")  # each prompt once, not n times
    assert completion.usage.completion_tokens == 2 * (2 + 1)
    assert [r[p.NUM_RETURN_SEQUENCES] for r in worker.requests] == [[2], [2]]


def test_echo_and_logprobs_per_choice_whole_and_streamed():
    """Each choice echoes the prompt and scores it, though the worker sends the prompt's table once; text_offset
    counts within each choice's own text."""

    async def scenario(client, state):
        whole = await client.completions.create(
            model=MODEL, prompt="ab", n=2, seed=10, max_tokens=2, echo=True, logprobs=1
        )
        stream = await client.completions.create(
            model=MODEL, prompt="ab", n=2, seed=10, max_tokens=2, echo=True, logprobs=1, stream=True
        )
        return whole, [event.choices[0] async for event in stream]

    _, (whole, streamed) = _run(scenario)
    for index, choice in enumerate(whole.choices):
        ws = words(10 + index, 2)
        assert choice.text == "ab" + "".join(ws)
        assert choice.logprobs.tokens == ["a", "b", *ws] and choice.logprobs.token_logprobs[0] is None
        assert choice.logprobs.text_offset == [0, 1, *(2 + len("".join(ws[:k])) for k in range(len(ws)))]
    for index in (0, 1):
        mine = [c for c in streamed if c.index == index]
        assert mine[0].text == "ab" and "".join(c.text for c in mine) == whole.choices[index].text
        offsets = [o for c in mine for o in c.logprobs.text_offset]
        assert offsets == whole.choices[index].logprobs.text_offset


@pytest.mark.parametrize(
    ("api", "fields", "named"),
    [
        *((api, {"n": n}, "n") for api in ("chat", "completions") for n in (0, 129)),
        ("completions", {"n": 2, "best_of": 3}, "best_of"),
    ],
)
def test_n_out_of_range_is_a_400_naming_it(api, fields, named):
    async def scenario(client, state):
        create = client.chat.completions.create if api == "chat" else client.completions.create
        body = {"messages": CHAT} if api == "chat" else {"prompt": "hi"}
        with pytest.raises(openai.BadRequestError) as info:
            await create(model=MODEL, max_tokens=2, **body, **fields)
        return info.value

    _, error = _run(scenario)
    assert error.status_code == 400 and named in error.message


def test_best_of_equal_to_n_is_accepted_and_a_batch_past_128_choices_refused():
    async def scenario(client, state):
        completion = await client.completions.create(model=MODEL, prompt="hi", n=2, best_of=2, max_tokens=2)
        with pytest.raises(openai.BadRequestError) as info:
            await client.completions.create(model=MODEL, prompt=["a", "b"], n=65, max_tokens=2)
        return completion, info.value

    _, (completion, error) = _run(scenario)
    assert len(completion.choices) == 2
    assert "128 choices" in error.message


def test_grpc_api_takes_n_and_names_each_chunks_choice():
    from service.gateway.grpc_api import start_grpc_server

    async def scenario(client, state):
        server, port = await start_grpc_server(state, "127.0.0.1", 0)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.CompletionsStub(channel)
                whole = await stub.Complete(pb.CompletionRequest(prompt="hi", n=2, seed=10, max_tokens=3))
                chunks = [
                    c async for c in stub.CompleteStream(pb.CompletionRequest(prompt="hi", n=2, seed=10, max_tokens=3))
                ]
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.Complete(pb.CompletionRequest(prompt="hi", n=0))
            return whole, chunks, info.value
        finally:
            await server.stop(0)

    _, (whole, chunks, error) = _run(scenario)
    assert [(c.index, c.text, c.finish_reason) for c in whole.choices] == [
        (i, _text(10 + i, 3), finish_reason(10 + i)) for i in range(2)
    ]
    assert whole.text == whole.choices[0].text and (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (2, 5)
    for index in (0, 1):
        mine = [c for c in chunks if c.index == index]
        assert "".join(c.text for c in mine) == _text(10 + index, 3)
        assert [c.finish_reason for c in mine] == [""] * (len(mine) - 1) + [finish_reason(10 + index)]
    assert [c.HasField("usage") for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (2, 5)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "n:" in (error.details() or "")


@pytest.mark.integration
def test_the_real_worker_forks_four_greedy_choices_streamed(tmp_path):
    """End to end through the real worker (the stub target under the real engine): one worker request for the four
    sequences, so the worker counts the prompt once (a fan-out would count it four times), and four greedy choices,
    each the one-choice answer; the usage counts the prompt once and the four completions."""
    worker = Worker(tmp_path, "--stub-step-ms", "1").start()
    gateway = Gateway(tmp_path, worker.address).start()
    try:
        worker.wait_ready()
        client = openai.OpenAI(base_url=f"{gateway.wait_ready().url}/v1", api_key="unused", max_retries=0)
        one = client.chat.completions.create(model="stub", messages=CHAT, max_tokens=12, temperature=0)
        events = list(
            client.chat.completions.create(
                model="stub",
                messages=CHAT,
                max_tokens=12,
                temperature=0,
                n=4,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        worker_prompt_tokens = metric_value(worker.metrics(), PROMPT_TOKENS_TOTAL)
    finally:
        gateway.terminate()
        worker.terminate()
    *chunks, last = events
    choices = [e.choices[0] for e in chunks]
    assert [(c.index, c.delta.role) for c in choices[:4]] == [(i, "assistant") for i in range(4)]
    for index in range(4):
        mine = [c for c in choices[4:] if c.index == index]
        assert "".join(c.delta.content or "" for c in mine) == one.choices[0].message.content
        assert [c.finish_reason for c in mine if c.finish_reason] == [one.choices[0].finish_reason]
    assert last.usage is not None and one.usage is not None
    assert last.usage.prompt_tokens == one.usage.prompt_tokens
    assert last.usage.completion_tokens == 4 * one.usage.completion_tokens
    assert worker_prompt_tokens == 2 * one.usage.prompt_tokens  # the n = 1 request's and the forked one's


# -- the pieces --------------------------------------------------------------------------------------------------


def test_children_are_seeded_seed_plus_i_and_wrap_at_uint64():
    req = GenerationRequest("r", "m", prompt="x", n=3, seed=2**64 - 2)
    children = child_requests(req)
    assert [(c.request_id, c.seed, c.n) for c in children] == [
        ("r-0", 2**64 - 2, 1),
        ("r-1", 2**64 - 1, 1),
        ("r-2", 0, 1),
    ]
    assert [c.seed for c in child_requests(GenerationRequest("r", "m", prompt="x", n=2))] == [None, None]


def test_a_failing_child_fails_the_request_and_cancels_the_others():
    cancelled = []

    async def call(req, timeout_s):
        if req.request_id.endswith("-1"):
            raise WorkerError("UNAVAILABLE", "child 1 failed")
        try:
            yield Chunk("a")
            await asyncio.sleep(60)
        finally:
            cancelled.append(req.request_id)

    async def main():
        return [chunk async for chunk in fan_out(call, GenerationRequest("r", "m", prompt="x", n=3), 5)]

    with pytest.raises(WorkerError, match="child 1 failed"):
        asyncio.run(main())
    assert sorted(cancelled) == ["r-0", "r-2"]


def test_total_stats_count_the_prompt_once_and_sum_the_rest():
    stats = [p.RequestStats(5, 3, 4, 2, 1), p.RequestStats(5, 2, 2, 1, 1)]
    assert total_stats(stats) == p.RequestStats(5, 5, 6, 3, 2)
    assert total_stats([]) == p.RequestStats()


# -- an OpenAI-HTTP upstream: n forwarded, each choice's index read -------------------------------------------


def test_openai_upstream_gets_n_and_its_choices_come_back_by_index():
    bodies = []

    def handler(request):
        body = json.loads(request.content)
        bodies.append(body)
        if not body["stream"]:
            return httpx.Response(
                200,
                json={
                    "choices": [
                        {"index": 1, "text": "b", "finish_reason": "stop"},
                        {"index": 0, "text": "a", "finish_reason": "length"},
                    ],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 2},
                },
            )
        return httpx.Response(
            200,
            content=_sse(
                {"choices": [{"index": 0, "text": "a", "finish_reason": None}]},
                {"choices": [{"index": 1, "text": "b", "finish_reason": None}]},
                {"choices": [{"index": 1, "text": "B", "finish_reason": "stop"}]},
                {"choices": [{"index": 0, "text": "A", "finish_reason": "length"}]},
                {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}},
                "[DONE]",
            ),
        )

    client = _client(handler)
    req = GenerationRequest("r", "m", prompt="abc", max_tokens=2, n=2)
    streamed = asyncio.run(_collect(client, req))
    whole = asyncio.run(_collect(client, req, stream=False))
    assert [b["n"] for b in bodies] == [2, 2]
    assert [(c.index, c.text, c.finish_reason, c.final) for c in streamed] == [
        (0, "a", None, False),
        (1, "b", None, False),
        (0, "A", "length", False),
        (1, "B", "stop", True),
    ]
    assert [(c.index, c.text, c.finish_reason, c.final) for c in whole] == [
        (0, "a", "length", False),
        (1, "b", "stop", True),
    ]
    for chunks, num_output in ((streamed, 4), (whole, 2)):
        total = total_stats(c.stats for c in chunks if c.finish_reason)  # each choice's last chunk
        assert (total.num_prompt_tokens, total.num_output_tokens) == (3, num_output)


def test_an_openai_upstream_that_ignores_n_is_refused():
    client = _client(
        lambda request: httpx.Response(
            200, json={"choices": [{"index": 0, "text": "a", "finish_reason": "stop"}], "usage": {}}
        )
    )
    with pytest.raises(WorkerError) as info:
        asyncio.run(_collect(client, GenerationRequest("r", "m", prompt="x", n=2), stream=False))
    assert info.value.status == "INVALID_ARGUMENT" and "choices [0] of the 2 asked" in info.value.message
