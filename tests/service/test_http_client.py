"""The gateway's HTTP/1.1 client (service/gateway/http_client.py) against a loopback server that writes exact bytes:
keep-alive reuse, bodies by length, chunks and end of connection, streaming as bytes arrive, the deadline, broken
and malformed answers, the stale keep-alive retry, the connection cap and the linger after release."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from service.gateway import http_client
from service.gateway.http_client import HttpPool, UpstreamBroken, UpstreamConnectError
from tests.ports import free_port

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Server:
    """A loopback server whose `answer(request_bytes, reader, writer)` coroutine answers each request it reads (a
    request is read up to the end of its body by Content-Length). Counts the connections it accepted."""

    def __init__(self, answer):
        self.answer, self.connections, self.requests = answer, 0, []

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                if await self.answer(request, reader, writer) is False:
                    break
        writer.close()


async def _ok(request, reader, writer):
    writer.write(OK)
    await writer.drain()


def test_keep_alive_reuses_one_connection():
    async def run():
        async with Server(_ok) as server:
            pool = HttpPool("127.0.0.1", server.port)
            for _ in range(3):
                response = await pool.request("POST", "/v1/completions", b'{"a": 1}', "application/json", 5)
                assert (response.status, await response.read()) == (200, b"{}")
                response.release()
            await pool.close()
            return server

    server = asyncio.run(run())
    assert server.connections == 1
    first = server.requests[0]
    assert first.startswith(b"POST /v1/completions HTTP/1.1\r\n")
    assert b"Content-Length: 8\r\n" in first and b"Content-Type: application/json\r\n" in first
    assert first.endswith(b'\r\n\r\n{"a": 1}') and b"Host: 127.0.0.1:" in first


def test_chunks_arrive_as_they_are_sent():
    """The reader sees the first event before the server writes the second: a stream is not buffered to its end."""
    second_sent = asyncio.Event

    async def run():
        gate = second_sent()

        async def answer(request, reader, writer):
            writer.write(CHUNKED_HEAD + _chunk(b"data: 1\n\n"))
            await writer.drain()
            await gate.wait()
            writer.write(_chunk(b"data: 2\n\n") + b"0\r\n\r\n")
            await writer.drain()

        async with Server(answer) as server:
            pool = HttpPool("127.0.0.1", server.port)
            response = await pool.request("GET", "/stream", timeout_s=5)
            seen = []
            async for piece in response.pieces():
                seen.append(piece)
                gate.set()
            response.release()
            assert pool.num_open == 1 and len(pool._idle) == 1  # read to its end: kept
            return seen

    assert asyncio.run(run()) == [b"data: 1\n\n", b"data: 2\n\n"]


def _fetch(answer_bytes: bytes, close: bool = False) -> tuple[bytes, int]:
    """GET / from a server that answers `answer_bytes` (then closes the connection, with `close`) -> (the body the
    pool read, its connections still open)."""

    async def answer(request, reader, writer):
        writer.write(answer_bytes)
        await writer.drain()
        return not close

    async def run():
        async with Server(answer) as server:
            pool = HttpPool("127.0.0.1", server.port)
            response = await pool.request("GET", "/", timeout_s=5)
            body = await response.read()
            response.release()
            return body, pool.num_open

    return asyncio.run(run())


def test_a_body_without_length_ends_with_the_connection():
    assert _fetch(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it", close=True) == (b"all of it", 0)


def test_a_connection_cut_mid_body_is_broken():
    with pytest.raises(UpstreamBroken, match="before its answer ended"):
        _fetch(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part", close=True)


def test_malformed_http_is_broken():
    with pytest.raises(UpstreamBroken, match="malformed HTTP"):
        _fetch(b"SPDY/9 banana\r\n\r\n")


def test_refused_connection():
    async def run():
        await HttpPool("127.0.0.1", free_port()).request("GET", "/", timeout_s=5)

    with pytest.raises(UpstreamConnectError, match="cannot connect"):
        asyncio.run(run())


def test_deadline_covers_the_body_and_closes_the_connection():
    closed = []

    async def answer(request, reader, writer):
        writer.write(CHUNKED_HEAD + _chunk(b"data: 1\n\n"))
        await writer.drain()
        closed.append(await reader.read())  # b"" once the client closes

    async def run():
        async with Server(answer) as server:
            pool = HttpPool("127.0.0.1", server.port)
            response = await pool.request("GET", "/", timeout_s=0.3)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            with pytest.raises(TimeoutError):
                async for _ in response.pieces():
                    pass
            elapsed = loop.time() - t0
            await asyncio.sleep(0.1)
            return elapsed, pool.num_open

    elapsed, num_open = asyncio.run(run())
    assert elapsed < 2 and num_open == 0 and closed == [b""]


def test_a_stale_keep_alive_connection_is_retried_once_on_a_new_one():
    """A server closing a kept connection as the next request arrives on it (its keep-alive ran out) answers
    nothing: that request goes again, on a new connection, and succeeds."""
    served: dict[int, int] = {}

    async def answer(request, reader, writer):
        served[id(writer)] = served.get(id(writer), 0) + 1
        if served[id(writer)] > 1:
            return False  # closes unanswered
        writer.write(OK)
        await writer.drain()

    async def run():
        async with Server(answer) as server:
            pool = HttpPool("127.0.0.1", server.port)
            for _ in range(2):
                response = await pool.request("POST", "/", b"{}", "application/json", 5)
                assert await response.read() == b"{}"
                response.release()
            return server.connections, len(server.requests)

    assert asyncio.run(run()) == (2, 3)


def test_a_reused_connection_that_breaks_after_the_answer_started_is_not_retried():
    answers = iter([OK, b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\npart"])

    async def answer(request, reader, writer):
        data = next(answers)
        writer.write(data)
        await writer.drain()
        return data == OK

    async def run():
        async with Server(answer) as server:
            pool = HttpPool("127.0.0.1", server.port)
            response = await pool.request("GET", "/", timeout_s=5)
            await response.read()
            response.release()
            response = await pool.request("GET", "/", timeout_s=5)  # on the kept connection
            try:
                await response.read()
            finally:
                assert server.connections == 1

    with pytest.raises(UpstreamBroken):
        asyncio.run(run())


def test_the_connection_cap_makes_a_request_wait_for_a_free_connection():
    async def run():
        gate = asyncio.Event()

        async def answer(request, reader, writer):
            if request.startswith(b"GET /slow"):
                await gate.wait()
            writer.write(OK)
            await writer.drain()

        async with Server(answer) as server:
            pool = HttpPool("127.0.0.1", server.port, max_connections=1)
            slow = asyncio.ensure_future(pool.request("GET", "/slow", timeout_s=5))
            await asyncio.sleep(0.05)
            fast = asyncio.ensure_future(pool.request("GET", "/fast", timeout_s=5))
            await asyncio.sleep(0.05)
            assert not fast.done() and pool.num_open == 1
            gate.set()
            response = await slow
            await response.read()
            response.release()
            response = await fast
            assert await response.read() == b"{}"
            response.release()
            return server.connections

    assert asyncio.run(run()) == 1


def test_released_before_the_end_the_connection_waits_for_it():
    """An SSE reader stops at `[DONE]` and releases; the stream's end-of-body chunk arrives after: the connection
    goes back to the pool then, and what came in between is dropped."""

    async def run():
        gate = asyncio.Event()

        async def answer(request, reader, writer):
            if request.startswith(b"GET /stream"):
                writer.write(CHUNKED_HEAD + _chunk(b"data: [DONE]\n\n"))
                await writer.drain()
                await gate.wait()
                writer.write(_chunk(b": trailing comment\n\n") + b"0\r\n\r\n")
            else:
                writer.write(OK)
            await writer.drain()

        async with Server(answer) as server:
            pool = HttpPool("127.0.0.1", server.port)
            response = await pool.request("GET", "/stream", timeout_s=5)
            async for piece in response.pieces():
                assert piece == b"data: [DONE]\n\n"
                break
            response.release()
            assert not pool._idle
            gate.set()
            await asyncio.sleep(0.05)
            assert len(pool._idle) == 1
            response = await pool.request("GET", "/after", timeout_s=5)
            return await response.read(), server.connections

    assert asyncio.run(run()) == (b"{}", 1)


def test_an_idle_connection_past_keepalive_is_not_reused():
    async def run():
        async with Server(_ok) as server:
            pool = HttpPool("127.0.0.1", server.port, keepalive_s=0.0)
            for _ in range(2):
                response = await pool.request("GET", "/", timeout_s=5)
                await response.read()
                response.release()
                await asyncio.sleep(0.01)
            return server.connections

    assert asyncio.run(run()) == 2


def test_unread_body_past_the_high_water_mark_pauses_reading(monkeypatch):
    monkeypatch.setattr(http_client, "HIGH_WATER_BYTES", 1000)
    body = b"x" * 200_000

    async def answer(request, reader, writer):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()

    async def run():
        async with Server(answer) as server:
            pool = HttpPool("127.0.0.1", server.port)
            response = await pool.request("GET", "/", timeout_s=5)
            await asyncio.sleep(0.1)
            paused = response._connection._paused
            data = await response.read()
            return paused, len(data), response._connection._paused

    assert asyncio.run(run()) == (True, len(body), False)


def test_read_refuses_a_body_past_the_limit(monkeypatch):
    monkeypatch.setattr(http_client, "MAX_BODY_BYTES", 10)
    with pytest.raises(UpstreamBroken, match="longer than 10 bytes"):
        _fetch(b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n" + b"y" * 20)


def test_for_url():
    async def run():
        plain = HttpPool.for_url("http://10.0.0.1:8000")
        secure = HttpPool.for_url("https://engine.example")
        ipv6 = HttpPool.for_url("http://[::1]:9")
        return plain, secure, ipv6

    plain, secure, ipv6 = asyncio.run(run())
    assert (plain.host, plain.port, plain.tls) == ("10.0.0.1", 8000, None)
    assert (secure.host, secure.port) == ("engine.example", 443) and secure.tls is not None
    assert ipv6._host_header == b"Host: [::1]:9\r\n"
    for bad in ("ftp://x:1", "http://x:1/v1", "x:1"):
        with pytest.raises(ValueError, match="http"):
            asyncio.run(_pool_for(bad))


async def _pool_for(url: str) -> HttpPool:
    return HttpPool.for_url(url)
