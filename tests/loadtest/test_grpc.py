"""The gRPC client against a tiny fake `deepspec.v1.Completions` server started here."""

import asyncio

import grpc
import pytest

from deepspec_protocol.protos.deepspec.v1 import completions_pb2 as pb
from deepspec_protocol.protos.deepspec.v1 import completions_pb2_grpc as pb_grpc
from loadtest.clients.grpc import GrpcClient
from loadtest.records import RequestInput
from tests.ports import free_port

TTFT, ITL = 0.040, 0.010


class FakeCompletions(pb_grpc.CompletionsServicer):
    """Streams max_tokens tokens in chunks of 2 (a speculative step accepting one draft token each)."""

    def __init__(self):
        self.requests = []

    async def CompleteStream(self, request, context):
        self.requests.append(request)
        if "__busy__" in request.prompt:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")
        n = request.max_tokens or 8
        await asyncio.sleep(TTFT)
        sent = 0
        while sent < n:
            if sent:
                await asyncio.sleep(ITL)
            k = min(2, n - sent)
            sent += k
            last = sent == n
            yield pb.CompletionChunk(
                id="r1",
                text=" tok" * k,
                num_tokens=k,
                finish_reason="length" if last else "",
                usage=pb.Usage(prompt_tokens=3, completion_tokens=n, total_tokens=n + 3) if last else None,
            )

    async def Complete(self, request, context):
        self.requests.append(request)
        return pb.CompletionResponse(
            id="r2",
            text="hello world",
            finish_reason="stop",
            usage=pb.Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5),
        )


async def _with_server(fn):
    servicer = FakeCompletions()
    server = grpc.aio.server()
    pb_grpc.add_CompletionsServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        return await fn(f"127.0.0.1:{port}"), servicer
    finally:
        await server.stop(None)


def test_stream_timings_and_exact_token_counts():
    async def go(addr):
        async with GrpcClient(addr, model=None, pool_size=4) as c:
            return await c.send(RequestInput("a b c", max_tokens=7, ignore_eos=True))

    out, servicer = asyncio.run(_with_server(go))
    assert out.success, out.error
    assert TTFT <= out.ttft_s < TTFT + 0.025 and out.e2e_s >= TTFT + 3 * ITL
    assert len(out.itl_s) == 3  # 7 tokens in chunks of 2, 2, 2, 1
    assert (out.output_tokens, out.prompt_tokens) == (7, 3)
    assert out.tpot_s == pytest.approx((out.e2e_s - out.ttft_s) / 6)
    req = servicer.requests[0]
    assert (req.prompt, req.max_tokens, req.ignore_eos, req.temperature) == ("a b c", 7, True, 0.0)


def test_unary_complete_and_chat_messages():
    async def go(addr):
        async with GrpcClient(addr, model="m", stream=False) as c:
            return await c.send(RequestInput("x", messages=[{"role": "user", "content": "hi"}], max_tokens=2))

    out, servicer = asyncio.run(_with_server(go))
    assert out.success and out.output_tokens == 2 and out.generated_text == "hello world" and out.ttft_s == out.e2e_s
    assert servicer.requests[0].messages[0].content == "hi" and servicer.requests[0].model == "m"


def test_status_codes_become_error_kinds():
    async def go(addr):
        async with GrpcClient(addr, model=None) as c:
            return await c.send(RequestInput("__busy__"))

    out, _ = asyncio.run(_with_server(go))
    assert not out.success and out.error_kind == "grpc_resource_exhausted" and out.error == "queue full"


def test_server_down_is_unavailable(monkeypatch):
    monkeypatch.setattr("loadtest.clients.grpc.CONNECT_TIMEOUT_S", 0.2)

    async def go():
        async with GrpcClient(f"127.0.0.1:{free_port()}", model=None, timeout_s=5) as c:
            return await c.send(RequestInput("a"))

    out = asyncio.run(go())
    assert not out.success and out.error_kind == "grpc_unavailable"


def test_pool_spreads_large_concurrency_over_channels():
    assert GrpcClient("x:1", model=None, pool_size=200).num_channels == 4
    assert GrpcClient("x:1", model=None, pool_size=10).num_channels == 1
