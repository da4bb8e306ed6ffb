"""The HTTP client against the fake OpenAI server: timings land where the server's fixed latencies put them,
token counts come from usage, and every kind of failure is counted, never raised."""

import asyncio
import statistics

import pytest

from loadtest.clients.openai_http import OpenAIHttpClient, fetch_model_ids
from loadtest.fake_server import FakeOpenAIServer, FakeServerConfig
from loadtest.records import RequestInput
from tests.ports import free_port

TTFT, ITL = 0.050, 0.010
# Lower bounds are strict (the client cannot see a chunk before the server sleeps and sends it); upper bounds
# allow for timers, the loopback and a machine shared with other jobs.
SLACK = 0.025


def run(coro):
    return asyncio.run(coro)


async def _send(config, req, *, chat=False, stream=True, timeout_s=10.0):
    async with (
        FakeOpenAIServer(config) as srv,
        OpenAIHttpClient(srv.url, chat=chat, model="fake-model", stream=stream, pool_size=4, timeout_s=timeout_s) as c,
    ):
        return await c.send(req)


@pytest.mark.parametrize("chat", [False, True])
def test_streaming_timings_and_tokens(chat):
    out = run(
        _send(FakeServerConfig(ttft_s=TTFT, itl_s=ITL), RequestInput("0 alpha beta gamma", max_tokens=6), chat=chat)
    )
    assert out.success, out.error
    assert TTFT <= out.ttft_s < TTFT + SLACK
    assert out.e2e_s >= TTFT + 5 * ITL
    assert len(out.itl_s) == 5 and ITL * 0.5 <= statistics.median(out.itl_s) < ITL + SLACK
    # the TPOT identity holds exactly: it is computed from the same timestamps.
    assert out.tpot_s == pytest.approx((out.e2e_s - out.ttft_s) / 5)
    assert out.tpot_s is not None and ITL * 0.5 <= out.tpot_s < ITL + SLACK
    assert (out.output_tokens, out.prompt_tokens, out.usage_reported) == (6, 4, True)
    assert out.generated_text == " 0 alpha beta gamma 0 alpha"


def test_multi_token_chunks_count_tokens_from_usage_and_itl_per_chunk():
    out = run(_send(FakeServerConfig(itl_s=ITL, tokens_per_chunk=4), RequestInput("a b c d", max_tokens=16)))
    assert out.success and out.output_tokens == 16 and len(out.itl_s) == 3


def test_non_streaming_sets_ttft_to_e2e():
    out = run(
        _send(FakeServerConfig(ttft_s=TTFT, itl_s=ITL), RequestInput("a b", max_tokens=4), stream=False, chat=True)
    )
    assert out.success and out.ttft_s == out.e2e_s and out.output_tokens == 4 and out.itl_s == []
    assert TTFT + 3 * ITL <= out.e2e_s < TTFT + 3 * ITL + SLACK


def test_request_body():
    c = OpenAIHttpClient("http://x/", chat=True, model="m")
    body = c.build_body(RequestInput("hi", max_tokens=7, ignore_eos=True))
    assert c.url == "http://x/v1/chat/completions"
    assert body == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 7,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert "ignore_eos" not in OpenAIHttpClient("http://x", chat=False, model=None).build_body(RequestInput("hi"))


@pytest.mark.parametrize(
    ("prompt", "kind"),
    [
        ("a __429__", "http_429"),
        ("a __500__", "http_500"),
        ("a b __malformed__", "malformed_sse"),
        ("a b __drop__", "disconnected"),
    ],
)
def test_server_faults_become_error_kinds(prompt, kind):
    out = run(_send(FakeServerConfig(), RequestInput(prompt, max_tokens=8)))
    assert not out.success and out.error_kind == kind and out.error


def test_server_down_is_a_connect_error():
    async def go():
        async with OpenAIHttpClient(f"http://127.0.0.1:{free_port()}", chat=False, model=None, pool_size=1) as c:
            return await c.send(RequestInput("a"))

    out = run(go())
    assert not out.success and out.error_kind == "connect"


def test_slow_server_is_a_timeout():
    out = run(_send(FakeServerConfig(ttft_s=2.0), RequestInput("a", max_tokens=2), timeout_s=0.2))
    assert not out.success and out.error_kind == "timeout"


def test_stream_without_done_or_finish_reason_is_incomplete():
    async def go():
        async def handler(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            await reader.read(1000)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
                b'data: {"choices": [{"text": "hi", "finish_reason": null}]}\n\n'
            )
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with OpenAIHttpClient(f"http://127.0.0.1:{port}", chat=False, model=None) as c:
                return await c.send(RequestInput("a"))
        finally:
            server.close()

    out = run(go())
    assert out.error_kind == "incomplete_stream" and out.generated_text == "hi"


class BarrierServer(FakeOpenAIServer):
    """Holds every completion until `n` are in flight at once (or 10 s pass), however slowly the client sends."""

    def __init__(self, n: int) -> None:
        super().__init__(FakeServerConfig())
        self.n, self.all_in = n, asyncio.Event()

    async def _complete_one(self, chat, req, w):
        if self.counters.in_flight >= self.n:
            self.all_in.set()
        try:
            await asyncio.wait_for(self.all_in.wait(), 10)
        except TimeoutError:
            pass
        return await super()._complete_one(chat, req, w)


def test_pool_is_not_capped_at_100():
    """150 requests at once reach the server at once: aiohttp's default pool limit (100) is not in the way."""

    async def go():
        async with BarrierServer(150) as srv:
            async with OpenAIHttpClient(srv.url, chat=False, model=None, pool_size=150) as c:
                outs = await asyncio.gather(*(c.send(RequestInput(f"{i} x", max_tokens=2)) for i in range(150)))
            return outs, srv.counters.max_in_flight

    outs, max_in_flight = run(go())
    assert all(o.success for o in outs)
    assert max_in_flight == 150


def test_fetch_model_ids():
    async def go():
        async with FakeOpenAIServer(FakeServerConfig(model="tiny")) as srv:
            return await fetch_model_ids(srv.url)

    assert run(go()) == ["tiny"]
