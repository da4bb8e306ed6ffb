"""The OpenAI-HTTP upstream adapter: what each upstream answer becomes for the dispatcher and the client.

The real-server behaviour (streaming, kill -9, rejoin) is tested against llama.cpp in test_openai_upstream.py;
most tests here cover the answers a llama.cpp server never gives (429, 503, an error event inside the stream) from
a loopback server that answers with a test's handler, so each mapping rule runs without a network. The last ones
replay each engine's own stream shape (tests/service/fixtures/sse/<engine>.txt) from a small HTTP server through the
whole gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from deepspec_protocol.token_scores import TokenScore
from deepspec_protocol.worker import Constraint
from service.gateway.openai_client import (
    MAX_EVENT_BYTES,
    EventStream,
    OpenAIClient,
    error_message,
    request_body,
    status_for_http,
)
from service.gateway.settings import GatewaySettings
from service.gateway.upstreams import client_for, parse_address
from service.gateway.worker_client import GenerationRequest, WorkerClient, WorkerError
from tests.ports import free_port
from tests.service.conftest import in_process_gateway


def _serve_handler(handler) -> int:
    """An HTTP server on a loopback port, in a thread of its own, whose every answer is `handler(httpx.Request)` ->
    httpx.Response (streamed as its content is produced); a handler that raises httpx.ConnectError drops the
    connection unanswered. → its port."""
    from aiohttp import web

    async def answer(request: web.Request) -> web.StreamResponse:
        asked = httpx.Request(
            request.method,
            f"http://upstream{request.path_qs}",
            content=await request.read(),
            headers=dict(request.headers),
        )
        try:
            answered = handler(asked)
        except httpx.ConnectError:
            assert request.transport is not None  # aiohttp's, while the handler runs
            request.transport.close()
            return web.Response()
        response = web.StreamResponse(
            status=answered.status_code,
            headers={
                k: v for k, v in answered.headers.items() if k.lower() not in ("content-length", "transfer-encoding")
            },
        )
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):
            try:
                await response.write(answered.content)  # a body given whole (json=, bytes)
            except httpx.ResponseNotRead:  # one produced as it goes (an async generator)
                async for piece in answered.aiter_raw():
                    await response.write(piece)
            await response.write_eof()
        return response

    started, port = threading.Event(), free_port()

    def run():
        loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", answer)
        runner = web.AppRunner(app, access_log=None)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        started.set()
        loop.run_forever()

    threading.Thread(target=run, daemon=True).start()
    started.wait(10)
    return port


def _client(handler, **kwargs) -> OpenAIClient:
    """The adapter in front of `handler`, a real HTTP exchange on loopback."""
    return OpenAIClient("openai+http://upstream:1", f"http://127.0.0.1:{_serve_handler(handler)}", **kwargs)


def _sse(*events: dict | str) -> bytes:
    return b"".join(b"data: " + (e if isinstance(e, str) else json.dumps(e)).encode() + b"\n\n" for e in events)


async def _collect(client: OpenAIClient, req: GenerationRequest, stream: bool = True, timeout_s: float = 5.0):
    call = client.generate if stream else client.infer
    return [chunk async for chunk in call(req, timeout_s)]


REQ = GenerationRequest(request_id="r1", model="m", prompt="hi", max_tokens=4)


@pytest.mark.parametrize(
    "status, expected",
    [
        (429, "RESOURCE_EXHAUSTED"),
        (503, "RESOURCE_EXHAUSTED"),
        (400, "INVALID_ARGUMENT"),
        (422, "INVALID_ARGUMENT"),
        (404, "NOT_FOUND"),
        (500, "INTERNAL"),
        (502, "UNAVAILABLE"),
    ],
)
def test_upstream_status_becomes_the_dispatchers_status(status, expected):
    """429/503 are overload (retried elsewhere before the first token, 429 when every worker says so), 4xx the
    client's error, 5xx a failed worker. vLLM answers a full queue or a dead engine with 503 and bad input with 400
    (vllm-project/vllm vllm/entrypoints/openai/engine/serving.py OpenAIServing.create_error_response)."""
    body = {"error": {"message": "nope", "type": "BadRequestError", "param": None, "code": status}}
    client = _client(lambda request: httpx.Response(status, json=body))
    with pytest.raises(WorkerError) as e:
        asyncio.run(_collect(client, REQ))
    assert e.value.status == expected == status_for_http(status)
    assert "nope" in e.value.message and f"HTTP {status}" in e.value.message


def test_error_bodies_of_each_engine():
    """vLLM's current envelope `{"error": {...}}`, its older flat `{"object": "error", "message"}` and FastAPI's
    `{"detail"}` (llama.cpp's Python server on validation errors) all give their message."""
    assert error_message({"error": {"message": "a"}}, "x") == "a"
    assert error_message({"object": "error", "message": "b", "code": 400}, "x") == "b"
    assert "too long" in error_message({"detail": [{"msg": "too long"}]}, "x")
    assert error_message("not json", "fallback") == "fallback"


def test_stream_error_event_is_a_worker_error():
    """An engine that fails mid-stream sends `data: {"error": {..., "code": 500}}` and ends the stream
    (vllm-project/vllm vllm/entrypoints/openai/engine/serving.py OpenAIServing.create_streaming_error_response):
    the client must get an error, not a silently short completion."""
    events = _sse(
        {"choices": [{"index": 0, "text": "a", "finish_reason": None}]},
        {"error": {"message": "engine died", "type": "InternalServerError", "code": 500}},
        "[DONE]",
    )
    client = _client(lambda request: httpx.Response(200, content=events))

    async def run():
        seen = []
        with pytest.raises(WorkerError) as e:
            async for chunk in client.generate(REQ, 5.0):
                seen.append(chunk.text)
        return seen, e.value

    seen, error = asyncio.run(run())
    assert seen == ["a"] and error.status == "INTERNAL" and "engine died" in error.message


def test_stream_without_done_is_a_broken_stream():
    """A stream that ends without `[DONE]` (the server died between chunks) is UNAVAILABLE, never a completion."""
    events = _sse({"choices": [{"index": 0, "text": "a", "finish_reason": None}]})
    client = _client(lambda request: httpx.Response(200, content=events))
    with pytest.raises(WorkerError) as e:
        asyncio.run(_collect(client, REQ))
    assert e.value.status == "UNAVAILABLE"


def test_chat_stream_skips_the_role_chunk_and_ends_with_finish_and_usage():
    """The first chunk the dispatcher sees is the first token (so retries stay possible until then); the finish
    reason and the usage (the `include_usage` chunk after it) arrive together in the final chunk."""
    seen_bodies = []

    def handler(request):
        seen_bodies.append((request.url.path, json.loads(request.content)))
        return httpx.Response(
            200,
            content=_sse(
                {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
                {"choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}]},
                {"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "length"}]},
                {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}},
                "[DONE]",
            ),
        )

    req = GenerationRequest(request_id="r2", model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    chunks = asyncio.run(_collect(_client(handler), req))
    assert [c.text for c in chunks] == ["Hel", "lo"]
    assert chunks[-1].final and chunks[-1].finish_reason == "length"
    assert (chunks[-1].stats.num_prompt_tokens, chunks[-1].stats.num_output_tokens) == (7, 2)
    path, body = seen_bodies[0]
    assert path == "/v1/chat/completions" and body["stream_options"] == {"include_usage": True}
    assert body["messages"] == req.messages and "prompt" not in body


def test_whole_completion():
    def handler(request):
        assert request.url.path == "/v1/completions" and json.loads(request.content)["stream"] is False
        return httpx.Response(
            200,
            json={
                "choices": [{"index": 0, "text": "abc", "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1},
            },
        )

    (chunk,) = asyncio.run(_collect(_client(handler), REQ, stream=False))
    assert (chunk.text, chunk.finish_reason, chunk.final, chunk.stats.num_output_tokens) == ("abc", "stop", True, 1)


def test_request_body_leaves_unset_fields_to_the_engine():
    """top_k 0 is not sent: SGLang refuses 0 (sgl-project/sglang python/sglang/srt/sampling/sampling_params.py
    SamplingParams.verify: "top_k must be -1 (disable), or at least 1"); `max_tokens` None means what fits."""
    body = request_body(GenerationRequest(request_id="r", model="m", prompt="p", max_tokens=None, top_k=0), True)
    assert "top_k" not in body and "max_tokens" not in body and "ignore_eos" not in body
    assert "min_tokens" not in body
    body = request_body(GenerationRequest(request_id="r", model="m", prompt="p", top_k=5, seed=3, stop=["\n"]), False)
    assert (body["top_k"], body["seed"], body["stop"]) == (5, 3, ["\n"])
    assert "stream_options" not in body and "ignore_eos" not in body and "min_tokens" not in body


def test_ignore_eos_is_also_min_tokens_for_engines_that_drop_it():
    """`ignore_eos` is vLLM's, SGLang's and TensorRT-LLM's field (NVIDIA/TensorRT-LLM
    tensorrt_llm/serve/openai_protocol.py CompletionRequest: `ignore_eos`, `min_tokens`); llama.cpp's Python server
    drops it unread (abetlen/llama-cpp-python llama_cpp/server/types.py CreateCompletionRequest has no such field,
    and pydantic ignores unknown ones) but honours `min_tokens`, which holds back the end-of-sequence token. Both
    are sent, so every engine generates max_tokens; with max_tokens unset (what fits) there is no count to ask for."""
    body = request_body(GenerationRequest(request_id="r", model="m", prompt="p", max_tokens=40, ignore_eos=True), True)
    assert (body["ignore_eos"], body["min_tokens"], body["max_tokens"]) == (True, 40, 40)
    body = request_body(
        GenerationRequest(request_id="r", model="m", prompt="p", max_tokens=None, ignore_eos=True), True
    )
    assert body["ignore_eos"] is True and "min_tokens" not in body


def test_deadline_ends_a_stalled_stream():
    """The request timeout bounds the whole call, also a stream whose engine stops sending (504, not a hang)."""

    async def stalled():
        yield _sse({"choices": [{"index": 0, "text": "a", "finish_reason": None}]})
        await asyncio.sleep(30)

    client = _client(lambda request: httpx.Response(200, content=stalled()))
    with pytest.raises(WorkerError) as e:
        asyncio.run(_collect(client, REQ, timeout_s=0.3))
    assert e.value.status == "DEADLINE_EXCEEDED"


def test_max_outstanding_refuses_before_sending():
    """An engine that queues without bound never says 429: past `max_outstanding` the gateway counts the worker
    as saturated itself, and the request is not sent."""
    sent = []

    async def slow():
        await asyncio.sleep(0.2)
        yield _sse({"choices": [{"index": 0, "text": "a", "finish_reason": "stop"}]}, "[DONE]")

    def handler(request):
        sent.append(1)
        return httpx.Response(200, content=slow())

    client = _client(handler, max_outstanding=1)

    async def run():
        first = asyncio.create_task(_collect(client, REQ))
        await asyncio.sleep(0.05)
        with pytest.raises(WorkerError) as e:
            await _collect(client, REQ)
        await first
        return e.value

    assert asyncio.run(run()).status == "RESOURCE_EXHAUSTED"
    assert len(sent) == 1 and client.num_outstanding == 0


def test_health_is_the_engines_own_route():
    """vLLM, SGLang and trtllm-serve answer `/health` 200 when ready and 503 (or nothing) when their engine is down
    (vllm-project/vllm vllm/entrypoints/serve/instrumentator/health.py `health`: 503 on EngineDeadError).
    llama.cpp's Python server has no such route: its 404 still proves it answers (its `/v1/models` takes the model
    lock, abetlen/llama-cpp-python llama_cpp/server/app.py get_llama_proxy, so it stalls behind a generation and
    would read as down). A refused connection is UNAVAILABLE: the pool ejects at once."""
    answers = {"/health": 200}
    client = _client(
        lambda request: httpx.Response(answers[request.url.path], json={"data": [{"id": "m", "max_model_len": 512}]})
    )
    assert asyncio.run(client.is_ready(1.0))
    answers["/health"] = 503
    assert not asyncio.run(client.is_ready(1.0))
    answers["/health"] = 404
    assert asyncio.run(client.is_ready(1.0))
    answers["/v1/models"] = 200
    assert asyncio.run(client.model_info(1.0)) == {"m": 512}

    def refuse(request):
        raise httpx.ConnectError("refused")

    with pytest.raises(WorkerError) as e:
        asyncio.run(_client(refuse).is_ready(1.0))
    assert e.value.status == "UNAVAILABLE"


def test_worker_addresses_name_their_protocol():
    assert parse_address("openai+http://h:8000").protocol == "openai-http"
    assert parse_address("grpc://h:8001").protocol == "kserve-grpc"
    assert parse_address("h:8001", default="openai-http").protocol == "openai-http"
    openai_client = client_for("openai+https://h:1")
    assert isinstance(openai_client, OpenAIClient) and openai_client.base_url == "https://h:1"

    async def grpc_client():  # a gRPC aio channel needs a running loop
        client = client_for("grpc://h:1")
        await client.close()
        return client

    grpc_worker = asyncio.run(grpc_client())
    assert isinstance(grpc_worker, WorkerClient) and grpc_worker.address == "h:1"
    with pytest.raises(ValueError, match="unknown worker scheme 'http://'"):
        parse_address("http://h:1")
    with pytest.raises(ValueError, match="unknown worker scheme"):
        GatewaySettings(workers="h:1,tcp://h:2")
    with pytest.raises(ValueError, match="expected host:port"):
        GatewaySettings(workers="openai+http://h")
    assert GatewaySettings(workers="openai+http://h:1,grpc://h:2,h:3").workers == "openai+http://h:1,grpc://h:2,h:3"


def test_pool_ejects_a_refusing_openai_worker_at_once_and_readmits_it():
    """The pool's probe treats an OpenAI worker's refused connection as it treats a gRPC UNAVAILABLE: ejected on
    the first probe, not after `unhealthy_threshold` of them; one good probe admits it again with its models."""
    from service.gateway.routing import WorkerPool
    from service.metrics import GatewayMetrics

    state = {"up": True}

    def handler(request):
        if not state["up"]:
            raise httpx.ConnectError("refused")
        return httpx.Response(200, json={"data": [{"id": "m"}]})

    async def run():
        pool = WorkerPool(
            "openai+http://upstream:1",
            GatewayMetrics(),
            unhealthy_threshold=3,
            make_client=lambda address: _client(handler),
        )
        pool._add("openai+http://upstream:1")
        (endpoint,) = pool.endpoints.values()
        await pool.probe_all()
        admitted = endpoint.healthy, dict(endpoint.models)
        state["up"] = False
        await pool.probe_all()
        ejected = not endpoint.healthy
        state["up"] = True
        await pool.probe_all()
        await pool.stop()
        return admitted, ejected, endpoint.healthy

    assert asyncio.run(run()) == ((True, {"m": 0}), True, True)


def test_stream_without_usage_counts_its_text_chunks():
    """llama.cpp's Python server ignores `stream_options` (abetlen/llama-cpp-python llama_cpp/server/types.py
    CreateCompletionRequest has no such field) and streams one token per chunk: the completion tokens are the
    chunks that carried text, the prompt tokens stay unknown (0) rather than being made up."""
    events = _sse(
        {"choices": [{"index": 0, "text": "a", "finish_reason": None}]},
        {"choices": [{"index": 0, "text": "b", "finish_reason": None}]},
        {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]},
        "[DONE]",
    )
    chunks = asyncio.run(_collect(_client(lambda request: httpx.Response(200, content=events)), REQ))
    assert [c.text for c in chunks] == ["a", "b", ""] and chunks[-1].finish_reason == "length"
    assert (chunks[-1].stats.num_output_tokens, chunks[-1].stats.num_prompt_tokens) == (2, 0)


def _fed(stream: EventStream, pieces: list[bytes]) -> list[tuple[str, str | None, bool]]:
    return [(c.text, c.finish_reason, c.final) for piece in pieces for c in stream.feed(piece)]


@pytest.mark.parametrize("cut", [1, 2, 7, 10_000])
def test_an_event_stream_reads_the_same_chunks_however_its_bytes_arrive(cut):
    """Reads hand over whatever has arrived: part of a line, several events at once; lines end in \\n or \\r\\n (SSE
    allows both; sse-starlette, under llama.cpp's Python server, writes \\r\\n), comments are keep-alives."""
    events = (
        _sse({"choices": [{"index": 0, "text": "é", "finish_reason": None}]}).replace(b"\n", b"\r\n")
        + b": keep-alive\n\n"
        + _sse(
            {"choices": [{"index": 0, "text": "b", "finish_reason": "stop"}]},
            {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
            "[DONE]",
            {"choices": [{"index": 0, "text": "after [DONE]"}]},
        )
    )
    stream = EventStream(REQ)
    assert _fed(stream, [events[i : i + cut] for i in range(0, len(events), cut)]) == [
        ("é", None, False),
        ("b", "stop", True),
    ]
    assert stream.done


def test_an_event_stream_refuses_a_line_past_its_limit():
    with pytest.raises(WorkerError) as e:
        _fed(EventStream(REQ), [b"data: " + b"x" * MAX_EVENT_BYTES])
    assert e.value.status == "INTERNAL" and "longer than" in e.value.message


def test_an_event_that_is_not_utf8_is_read_with_replacement_characters():
    (chunk,) = _fed(EventStream(REQ), [b'data: {"choices": [{"index": 0, "text": "a\xff"}]}\n'])
    assert chunk[0] == "a\ufffd"


def test_a_stream_whose_last_line_is_unended_still_finishes():
    """A server may close the body right after `data: [DONE]` without its blank line (or newline)."""
    events = _sse({"choices": [{"index": 0, "text": "a", "finish_reason": "stop"}]}) + b"data: [DONE]"
    chunks = asyncio.run(_collect(_client(lambda request: httpx.Response(200, content=events)), REQ))
    assert [(c.text, c.final) for c in chunks] == [("a", True)]


# -- each engine's stream through the whole gateway ------------------------------------------------------------------

SSE_FIXTURES = Path(__file__).parent / "fixtures" / "sse"
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
FIXTURE_MODEL = "Qwen/Qwen3-8B"
#: engine -> route -> what the gateway must stream back: (text, finish_reason, prompt_tokens, completion_tokens)
ENGINE_STREAMS = {
    "vllm": {
        CHAT: ("Hello there! How can I help?", "stop", 14, 9),
        COMPLETIONS: (" Paris. It is the largest city in", "length", 5, 8),
    },
    "sglang": {
        CHAT: ("Hello there! How can I help?", "stop", 14, 9),
        COMPLETIONS: (" Paris. It is the largest city in", "length", 5, 8),
    },
    "trtllm-serve": {
        CHAT: ("Hello there! How can I help?", "stop", 14, 9),
        COMPLETIONS: (" Paris. It is the largest city in", "length", 5, 8),
    },
    # no usage in the stream: the completion tokens are its text chunks (one token each), the prompt's unknown
    "llama.cpp": {
        CHAT: ("Hello there, welcome to my world! I", "length", 0, 9),
        COMPLETIONS: (" Paris.\n- The United States has", "length", 0, 8),
    },
}
#: llama.cpp's Python server has no /health route (404), which the gateway reads as "answers HTTP at all"
HEALTH_STATUS = {"llama.cpp": 404}


def _fixture_bodies(engine: str) -> dict[str, bytes]:
    """Route -> the body a POST to it answers: each `@@ <route>` section of fixtures/sse/<engine>.txt, byte for
    byte (the `#` lines before the first section are notes)."""
    bodies: dict[str, bytes] = {}
    route = None
    for line in (SSE_FIXTURES / f"{engine}.txt").read_bytes().splitlines(keepends=True):
        if line.startswith(b"@@ "):
            route = line[3:].strip().decode()
            bodies[route] = b""
        elif route is not None:
            bodies[route] += line
    return bodies


@contextlib.asynccontextmanager
async def _replaying_engine(bodies: dict[str, bytes], health_status: int, owned_by: str | None = None):
    """An HTTP server that answers like the engine: `/health`, `/v1/models` with FIXTURE_MODEL (owned by `owned_by`,
    when given), and each generation route with its recorded body, written in pieces that cut lines and events apart
    (as TCP may deliver them). Yields its port and the JSON bodies it was sent."""
    from aiohttp import web

    sent: list[dict] = []
    card = {"id": FIXTURE_MODEL, "object": "model", **({"owned_by": owned_by} if owned_by else {})}

    async def health(request):
        return web.Response(status=health_status)

    async def models(request):
        return web.json_response({"object": "list", "data": [card]})

    async def generate(request):
        sent.append(await request.json())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        body = bodies[request.path]
        for start in range(0, len(body), 97):
            await response.write(body[start : start + 97])
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    for route in bodies:
        app.router.add_post(route, generate)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1], sent
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def _gateway_over(bodies: dict[str, bytes], health_status: int = 200, owned_by: str | None = None):
    """An in-process gateway whose one worker replays `bodies` (`_replaying_engine`), once it has admitted it;
    yields an HTTP client of the gateway and the bodies the engine was sent."""
    async with (
        _replaying_engine(bodies, health_status, owned_by) as (port, sent),
        in_process_gateway(f"openai+http://127.0.0.1:{port}", "the replaying engine") as (client, _),
    ):
        yield client, sent


def _stream_request(route: str, **extra) -> dict:
    if route == CHAT:
        request = {"model": FIXTURE_MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 9}
    else:
        request = {"model": FIXTURE_MODEL, "prompt": "The capital of France is", "max_tokens": 8}
    return request | {"stream": True, "stream_options": {"include_usage": True}} | extra


def _stream_through_gateway(bodies: dict[str, bytes], route: str, health_status: int = 200):
    """POST a streaming request for `route` to an in-process gateway whose one worker replays `bodies`; returns
    the gateway's events (JSON, then "[DONE]") and the body the engine was sent."""

    async def main():
        async with (
            _gateway_over(bodies, health_status) as (client, sent),
            client.stream("POST", route, json=_stream_request(route)) as response,
        ):
            assert response.status_code == 200, await response.aread()
            lines = [line async for line in response.aiter_lines() if line.startswith("data: ")]
        # JSON payloads (dicts, read as Any), then "[DONE]"
        events: list[Any] = [line[6:] if line == "data: [DONE]" else json.loads(line[6:]) for line in lines]
        return events, sent

    return asyncio.run(main())


@pytest.mark.parametrize("engine, route", [(e, r) for e, routes in ENGINE_STREAMS.items() for r in routes])
def test_each_engines_stream_shape_through_the_gateway(engine, route):
    """Each engine's streaming shape, as its source writes it, becomes the same OpenAI stream at the gateway: the
    text of every chunk in order, one finish_reason, and the engine's usage in the usage chunk before [DONE].

    The fixtures follow vLLM (vllm-project/vllm vllm/entrypoints/openai/serving_chat.py
    OpenAIServingChat.chat_completion_stream_generator, serving_completion.py
    OpenAIServingCompletion.completion_stream_generator), SGLang (sgl-project/sglang
    python/sglang/srt/entrypoints/openai/serving_chat.py OpenAIServingChat._generate_chat_stream,
    serving_completions.py OpenAIServingCompletion._generate_completion_stream) and TensorRT-LLM (NVIDIA/TensorRT-LLM
    tensorrt_llm/serve/postprocess_handlers.py chat_stream_post_processor / completion_stream_post_processor, sent by
    tensorrt_llm/serve/openai_server.py OpenAIServer.openai_chat / openai_completion); llama.cpp's is recorded from
    its Python server (abetlen/llama-cpp-python llama_cpp/server/app.py get_event_publisher, sse_starlette/sse.py
    EventSourceResponse._ping for the keep-alive). Their quirks, each in at least one fixture: a role chunk with
    empty (or no) content, chunks of several tokens, `"usage": null` on every chunk, the usage alone on a last chunk
    with empty `choices` or no usage at all, the finish_reason on a chunk of its own with an empty delta (SGLang and
    llama.cpp chat) or on the last text chunk, extra keys (`matched_stop`, `reasoning_content`,
    `avg_decoded_tokens_per_iter`), a space before the blank line (TensorRT-LLM's role chunk), a `: ping` comment."""
    text, finish_reason, prompt_tokens, completion_tokens = ENGINE_STREAMS[engine][route]
    events, sent = _stream_through_gateway(_fixture_bodies(engine), route, HEALTH_STATUS.get(engine, 200))
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if e["choices"]]
    choices = [c["choices"][0] for c in chunks]
    assert "".join(c["delta"].get("content") or "" if route == CHAT else c["text"] for c in choices) == text
    assert [c["finish_reason"] for c in choices if c["finish_reason"]] == [finish_reason]
    assert events[-2]["choices"] == [] and events[-2]["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    (body,) = sent
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


# -- structured outputs ----------------------------------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.mark.parametrize(
    ("constraint", "vllm_extras", "fields"),
    [
        (Constraint("json_object"), False, {"response_format": {"type": "json_object"}}),
        (
            Constraint("json_schema", json.dumps(SCHEMA)),
            False,
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "response", "schema": SCHEMA, "strict": True},
                }
            },
        ),
        (
            Constraint("json_schema", json.dumps(SCHEMA)),
            True,
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "response", "schema": SCHEMA, "strict": True},
                }
            },
        ),
        (Constraint("regex", "[0-9]+"), True, {"structured_outputs": {"regex": "[0-9]+"}}),
        (Constraint("grammar", 'root ::= "a"'), True, {"structured_outputs": {"grammar": 'root ::= "a"'}}),
        (Constraint("choice", '["yes", "no"]'), True, {"structured_outputs": {"choice": ["yes", "no"]}}),
    ],
)
def test_a_constraint_goes_upstream_in_the_field_the_engine_reads(constraint, vllm_extras, fields):
    """OpenAI's response_format (json_object, json_schema with name and schema), which vLLM, SGLang and trtllm-serve
    all read (vllm-project/vllm vllm/entrypoints/openai/engine/protocol.py ResponseFormat; sgl-project/sglang
    python/sglang/srt/entrypoints/openai/protocol.py ResponseFormat; NVIDIA/TensorRT-LLM
    tensorrt_llm/serve/openai_protocol.py ResponseFormat), and vLLM's structured_outputs for the kinds OpenAI cannot
    spell (vllm/sampling_params.py StructuredOutputsParams: regex, grammar, choice)."""
    body = request_body(GenerationRequest("r", "m", prompt="hi", structured_output=constraint), False, vllm_extras)
    assert {key: body[key] for key in fields} == fields
    assert not {"response_format", "structured_outputs"} - set(fields) & set(body)


@pytest.mark.parametrize("kind, spec", [("regex", "[0-9]+"), ("grammar", 'root ::= "a"'), ("choice", '["a"]')])
def test_kinds_only_vllm_reads_are_refused_for_other_engines(kind, spec):
    """SGLang, trtllm-serve and llama.cpp would drop vLLM's structured_outputs unread (free text for a constrained
    request): the request is refused before it is sent, naming the kind."""
    req = GenerationRequest("r", "m", prompt="hi", structured_output=Constraint(kind, spec))
    with pytest.raises(WorkerError) as e:
        request_body(req, False)
    assert e.value.status == "INVALID_ARGUMENT"
    assert f"{kind} structured outputs are not supported by this worker" in e.value.message


def test_a_schema_that_is_not_json_is_refused_with_the_engines_code():
    req = GenerationRequest("r", "m", prompt="hi", structured_output=Constraint("json_schema", "{not json"))
    with pytest.raises(WorkerError) as e:
        request_body(req, False)
    assert e.value.status == "INVALID_ARGUMENT" and e.value.code == "structured_output_invalid"


def _requests_through_gateway(owned_by: str | None, requests: list[tuple[str, dict]]):
    """Streaming requests (route, extra fields) to a gateway over a replaying engine whose model cards say
    `owned_by`; returns each answer's status and JSON error (None for a stream) and the bodies the engine was sent."""
    bodies = _fixture_bodies("vllm")

    async def main():
        answers = []
        async with _gateway_over(bodies, owned_by=owned_by) as (client, sent):
            for route, extra in requests:
                async with client.stream("POST", route, json=_stream_request(route, **extra)) as response:
                    raw = await response.aread()
                    answers.append(
                        (response.status_code, json.loads(raw)["error"] if response.status_code != 200 else None)
                    )
        return answers, sent

    return asyncio.run(main())


def test_a_vllm_upstream_is_sent_each_constraint_and_another_engine_only_the_json_ones():
    """Through the whole gateway: a vLLM engine (its /v1/models cards say owned_by "vllm",
    vllm/entrypoints/openai/engine/protocol.py ModelCard) gets response_format for a JSON schema and
    structured_outputs for a regex; an SGLang engine (owned_by "sglang", python/sglang/srt/entrypoints/openai/
    protocol.py ModelCard) gets response_format too, and a regex request is a 400 naming it, never sent."""
    schema = {"response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}}
    regex = {"structured_outputs": {"regex": "[0-9]+"}}
    answers, sent = _requests_through_gateway("vllm", [(CHAT, schema), (COMPLETIONS, regex)])
    assert [status for status, _ in answers] == [200, 200]
    assert sent[0]["response_format"]["json_schema"]["schema"] == SCHEMA and "structured_outputs" not in sent[0]
    assert sent[1]["structured_outputs"] == {"regex": "[0-9]+"} and "response_format" not in sent[1]

    answers, sent = _requests_through_gateway("sglang", [(CHAT, schema), (COMPLETIONS, regex)])
    (ok, _), (refused, error) = answers
    assert ok == 200 and sent[0]["response_format"]["json_schema"]["schema"] == SCHEMA
    assert refused == 400 and "regex structured outputs are not supported by this worker" in error["message"]
    assert len(sent) == 1  # the refused request never reached the engine


# -- logprobs --------------------------------------------------------------------------------------------------------

CHAT_REQ = GenerationRequest("r", "m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)


@pytest.mark.parametrize(
    ("req", "fields"),
    [
        (dataclasses.replace(CHAT_REQ, logprobs=0), {"logprobs": True, "top_logprobs": 0}),
        (dataclasses.replace(CHAT_REQ, logprobs=3), {"logprobs": True, "top_logprobs": 3}),
        (dataclasses.replace(REQ, logprobs=2), {"logprobs": 2}),
        (dataclasses.replace(REQ, logprobs=2, prompt_logprobs=2), {"logprobs": 2, "echo": True}),
        (dataclasses.replace(REQ, prompt_logprobs=1), {"logprobs": 1, "echo": True}),
        (REQ, {}),
    ],
)
def test_logprobs_go_upstream_in_openais_fields(req, fields):
    """Chat's `logprobs` + `top_logprobs`, completions' `logprobs` (one count for the prompt's and the completion's
    tokens) and `echo` for the prompt's, as OpenAI and vLLM read them (vllm/entrypoints/openai/chat_completion/
    protocol.py ChatCompletionRequest, completion/protocol.py CompletionRequest). top_logprobs goes even at 0:
    llama.cpp's server scores nothing without it (abetlen/llama-cpp-python llama_cpp/llama_chat_format.py
    `logprobs=top_logprobs if logprobs else None`)."""
    body = request_body(req, False)
    assert {key: body[key] for key in ("logprobs", "top_logprobs", "echo") if key in body} == fields


def test_token_id_prompts_go_as_openais_token_id_prompt():
    body = request_body(GenerationRequest("r", "m", prompt_token_ids=[5, 6, 7]), True)
    assert body["prompt"] == [5, 6, 7]


def test_max_tokens_0_goes_to_a_vllm_upstream_only():
    """vLLM answers max_tokens 0 with the echoed prompt alone (vllm/entrypoints/openai/completion/serving.py, the
    `max_tokens == 0` echo branch); llama.cpp's server reads it as "no limit" (llama_cpp/llama.py
    `if max_tokens is None or max_tokens <= 0: max_tokens = self._n_ctx - len(prompt_tokens)`), so it is refused
    for every other engine rather than sent."""
    req = GenerationRequest("r", "m", prompt="hi", max_tokens=0, prompt_logprobs=1)
    assert request_body(req, False, vllm_extras=True)["max_tokens"] == 0
    with pytest.raises(WorkerError) as e:
        request_body(req, False)
    assert e.value.status == "INVALID_ARGUMENT" and "max_tokens 0" in e.value.message


def _fixture_events(engine: str, route: str) -> list[dict]:
    body = _fixture_bodies(engine)[route].decode()
    return [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {")]


def _stream_events(bodies, route: str, request: dict, owned_by: str | None = "vllm"):
    """The gateway's streamed events for `request` over an engine replaying `bodies`, and what the engine was sent."""

    async def main():
        async with (
            _gateway_over(bodies, owned_by=owned_by) as (client, sent),
            client.stream("POST", route, json=request) as response,
        ):
            assert response.status_code == 200, await response.aread()
            lines = [line async for line in response.aiter_lines() if line.startswith("data: {")]
        return [json.loads(line[6:]) for line in lines], sent

    return asyncio.run(main())


def test_a_vllm_chat_stream_with_logprobs_reaches_the_client_as_the_engine_sent_it():
    """vLLM's streamed chat logprobs (fixtures/sse/vllm-logprobs.txt: vllm/entrypoints/openai/serving_chat.py
    chat_completion_stream_generator) become the gateway's, token for token: each chunk's `logprobs.content` the
    engine's for the same text, `bytes` the token's UTF-8."""
    request = _stream_request(CHAT, max_tokens=4, logprobs=True, top_logprobs=2)
    events, sent = _stream_events(_fixture_bodies("vllm-logprobs"), CHAT, request)
    (body,) = sent
    assert (body["logprobs"], body["top_logprobs"]) == (True, 2)
    engine = [c for e in _fixture_events("vllm-logprobs", CHAT) for c in e["choices"] if c["logprobs"]]
    ours = [c for e in events for c in e["choices"] if c["logprobs"]]
    assert [c["delta"]["content"] for c in ours] == [c["delta"]["content"] for c in engine]
    assert [c["logprobs"]["content"] for c in ours] == [c["logprobs"]["content"] for c in engine]
    assert ours[-1]["finish_reason"] == "length"


def test_a_vllm_completion_stream_with_echo_splits_the_prompts_scores_from_the_completions():
    """vLLM's echo stream puts the prompt's text and scores before the first token's in one chunk
    (vllm/entrypoints/openai/serving_completion.py completion_stream_generator, `has_echoed`); the gateway answers
    as it does for its own worker: the prompt in an event of its own, then each chunk with its tokens, the scores
    and text_offsets the engine's."""
    prompt = "The capital of France is"
    request = _stream_request(COMPLETIONS, prompt=prompt, max_tokens=2, echo=True, logprobs=2)
    events, sent = _stream_events(_fixture_bodies("vllm-logprobs"), COMPLETIONS, request)
    (body,) = sent
    assert (body["prompt"], body["echo"], body["logprobs"]) == (prompt, True, 2)
    choices = [c for e in events for c in e["choices"]]
    assert [c["text"] for c in choices] == [prompt, " Paris", "."]
    assert [c["finish_reason"] for c in choices] == [None, None, "length"]
    engine = [c["logprobs"] for e in _fixture_events("vllm-logprobs", COMPLETIONS) for c in e["choices"]]
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert [v for c in choices for v in c["logprobs"][key]] == [v for lp in engine for v in lp[key]], key
    assert choices[0]["logprobs"]["token_logprobs"][0] is None and len(choices[0]["logprobs"]["tokens"]) == 5


def test_whole_answers_keep_the_alternatives_asked_for_and_split_an_echoed_token_id_prompt():
    """Whole answers: chat alternatives past the top_logprobs asked for (llama.cpp's server appends the sampled
    token to them, llama_cpp/llama_chat_format.py _convert_text_completion_logprobs_to_chat) are dropped, the rest
    kept likeliest first; a token-id prompt's echo is its ids' count of tokens (vLLM answers token-id prompts with
    the decoded prompt echoed before the completion)."""

    def handler(request):
        body = json.loads(request.content)
        if request.url.path == CHAT:
            content = [
                {
                    "token": "Hi",
                    "logprob": -0.5,
                    "bytes": None,
                    "top_logprobs": [
                        {"token": "Hello", "logprob": -0.2, "bytes": None},
                        {"token": "Hi", "logprob": -0.5, "bytes": None},
                    ],
                }
            ]
            return httpx.Response(
                200,
                json={
                    "choices": [
                        {
                            "index": 0,
                            "message": {"content": "Hi"},
                            "finish_reason": "stop",
                            "logprobs": {"content": content},
                        }
                    ]
                },
            )
        assert body["prompt"] == [11, 12] and body["echo"] is True and body["logprobs"] == 1
        logprobs = {
            "tokens": ["a", "b", "c"],
            "token_logprobs": [None, -1.0, -2.0],
            "text_offset": [0, 1, 2],
            "top_logprobs": [None, {"b": -1.0, "x": -0.5}, {"c": -2.0, "y": -0.1}],
        }
        return httpx.Response(
            200,
            json={
                "choices": [{"index": 0, "text": "abc", "finish_reason": "length", "logprobs": logprobs}],
                "usage": {"prompt_tokens": 2, "completion_tokens": 1},
            },
        )

    client = _client(handler)
    (chat,) = asyncio.run(_collect(client, dataclasses.replace(CHAT_REQ, logprobs=1), stream=False))
    assert chat.logprobs == [TokenScore("Hi", -1, -0.5, ("Hello",), (-1,), (-0.2,))]
    req = GenerationRequest("r", "m", prompt_token_ids=[11, 12], max_tokens=1, logprobs=1, prompt_logprobs=1)
    (completion,) = asyncio.run(_collect(client, req, stream=False))
    assert completion.text == "c" and completion.prompt_logprobs == [
        TokenScore("a", -1, None),
        TokenScore("b", -1, -1.0, ("x",), (-1,), (-0.5,)),
    ]
    assert completion.logprobs == [TokenScore("c", -1, -2.0, ("y",), (-1,), (-0.1,))]


def test_an_engine_that_answers_without_the_logprobs_asked_for_is_a_400():
    """An engine that drops `logprobs` unread (fixtures/sse/vllm.txt has none) must not pass for one that scored
    nothing: the client asked for them."""
    bodies = _fixture_bodies("vllm")

    async def main():
        async with _gateway_over(bodies) as (client, _):
            return await client.post(COMPLETIONS, json=_stream_request(COMPLETIONS, logprobs=1))

    response = asyncio.run(main())
    assert response.status_code == 400 and "logprobs are not supported by this worker" in response.text


def test_processed_logprobs_are_refused_naming_logprobs_mode_and_never_sent():
    """No OpenAI server takes a logprobs mode per request: vLLM sets it per engine (vllm/engine/arg_utils.py
    --logprobs-mode; ChatCompletionRequest has no such field and would drop it unread), so the gateway refuses it
    rather than answer raw numbers for processed ones. The default is sent as a plain logprobs request."""

    async def main():
        async with _gateway_over(_fixture_bodies("vllm-logprobs"), owned_by="vllm") as (client, sent):
            answers = [
                await client.post(CHAT, json=_stream_request(CHAT, logprobs=True, logprobs_mode=mode))
                for mode in ("processed_logprobs", "raw_logprobs")
            ]
        return answers, sent

    (refused, ok), sent = asyncio.run(main())
    assert refused.status_code == 400 and refused.json()["error"]["message"].startswith(
        "processed logprobs (logprobs_mode) are not supported by this worker"
    )
    assert ok.status_code == 200 and len(sent) == 1 and "logprobs_mode" not in sent[0]


def test_the_grpc_api_leaves_an_unknown_token_id_unset():
    from service.gateway.grpc_api import _token_logprobs

    (token,) = _token_logprobs([TokenScore("Hi", -1, -0.5, ("Hello",), (-1,), (-0.2,))])
    assert not token.HasField("token_id") and not token.top_logprobs[0].HasField("token_id")
    (known,) = _token_logprobs([TokenScore("Hi", 7, -0.5, ("Hello",), (3,), (-0.2,))])
    assert known.token_id == 7 and known.top_logprobs[0].token_id == 3
