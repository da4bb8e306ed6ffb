"""HTTP/1.1 to one upstream over keep-alive connections: what the OpenAI adapter (openai_client.py) sends and reads.

Why not aiohttp's client: against a fast upstream it was the largest single part of what the gateway spends on a
request (a quarter of its CPU time, bench/openai_upstream.py), for features the gateway never uses (cookies,
redirects, compression, proxies, TLS, multipart). What is left is small: a request written in one `write`, the
answer parsed by httptools (llhttp, the parser uvicorn serves with) in the protocol's `data_received`, and its body
handed to the reader in whatever pieces arrived, without a task, a stream reader or a timer per read.

Semantics the adapter relies on:

- **One deadline per request** (`timeout_s`): a timer set when the request starts fails whatever awaits the answer
  with `TimeoutError` when it fires, closing the connection. Opening a connection has its own limit
  (`connect_timeout_s`).
- **Keep-alive**: a response read to its end on a connection both sides keep goes back to the pool (`release`);
  one left unfinished is closed (`close`), which is how an OpenAI server learns to abort the sequence. An idle
  connection is closed after `keepalive_s`, below the 5 s uvicorn (vLLM, SGLang, llama.cpp's Python server) keeps
  one, so the pool rarely sends on a connection its server is closing; when it does (the connection breaks before
  any byte of the answer), the request is sent once more on a fresh connection.
- **Backpressure**: past `HIGH_WATER_BYTES` of body not yet read, the connection stops reading from the socket.
- **Errors** are `UpstreamConnectError` (no connection could be opened) and `UpstreamBroken` (the connection closed,
  reset or spoke malformed HTTP before the answer ended); both are `OSError`s.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
import urllib.parse
from collections.abc import AsyncIterator
from typing import cast

import httptools

#: seconds an idle connection is kept (servers on uvicorn close theirs after 5 s)
KEEPALIVE_S = 4.0
#: seconds to open a connection
CONNECT_TIMEOUT_S = 2.0
#: unread body bytes past which the connection stops reading from its socket, and below which it reads again
HIGH_WATER_BYTES = 2**20
LOW_WATER_BYTES = 2**18
#: seconds a released connection waits for the rest of an answer its reader no longer needs
LINGER_S = 1.0
#: bytes `Response.read` takes before it refuses a body as too large
MAX_BODY_BYTES = 2**26


class UpstreamConnectError(OSError):
    """No connection to the upstream could be opened (refused, unreachable, too slow)."""


class UpstreamBroken(OSError):
    """The connection closed, was reset or spoke malformed HTTP before the answer ended."""


class Response:
    """One answer: `status` and `headers` (lower-case names) once `HttpPool.request` returns, the body through
    `pieces` or `read`. The caller ends it with `release` (read to its end: the connection is reused) or `close`."""

    def __init__(self, connection: _Connection, deadline: float | None):
        self.status = 0
        self.headers: dict[str, str] = {}
        self._connection = connection
        self._pieces: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._complete = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future | None = None
        self._headers_done = False
        self._released = False  # the caller is done with it; the connection waits for the answer's end
        #: a byte of the answer arrived (a request whose connection breaks before that may be sent again)
        self.started = False
        loop = connection.loop
        self._timer = None if deadline is None else loop.call_at(deadline, self._expire)

    @property
    def complete(self) -> bool:
        return self._complete

    async def pieces(self) -> AsyncIterator[bytes]:
        """The body as it arrives: each item is everything that arrived since the last, however many pieces."""
        while True:
            if self._pieces:
                data = b"".join(self._pieces) if len(self._pieces) > 1 else self._pieces[0]
                self._pieces.clear()
                self._buffered = 0
                self._connection.resume()
                yield data
            elif self._error is not None:
                raise self._error
            elif self._complete:
                return
            else:
                await self._wait()

    async def read(self) -> bytes:
        """The whole body; UpstreamBroken past MAX_BODY_BYTES."""
        parts, size = [], 0
        async for data in self.pieces():
            size += len(data)
            if size > MAX_BODY_BYTES:
                self.close()
                raise UpstreamBroken(f"the upstream's answer is longer than {MAX_BODY_BYTES} bytes")
            parts.append(data)
        return b"".join(parts)

    def release(self) -> None:
        """The caller is done with the answer: its connection goes back to the pool once the answer has ended. One
        that has not ended yet may only lack its last bytes (an SSE stream's end-of-body chunk trails its `[DONE]`
        event): the connection waits up to LINGER_S for them, dropping whatever else arrives, then closes."""
        self._stop_timer()
        if self._complete or self._error is not None:
            self._connection.finished(self)
        else:
            self._released = True
            self._timer = self._connection.loop.call_later(LINGER_S, self._expire)

    def close(self) -> None:
        """Close the connection, whatever is left unread (the upstream sees the disconnect)."""
        self._stop_timer()
        self._connection.close()

    # -- fed by the connection --------------------------------------------------------------------------------

    async def _wait(self) -> None:
        self._waiter = self._connection.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _feed(self, data: bytes) -> None:
        if self._released:
            return
        self._pieces.append(data)
        self._buffered += len(data)
        if self._buffered > HIGH_WATER_BYTES:
            self._connection.pause()
        self._wake()

    def _headers(self, status: int) -> None:
        self.status, self._headers_done = status, True
        self._wake()

    def _finish(self) -> None:
        self._complete = True
        self._stop_timer()
        if self._released:
            self._connection.finished(self)
        else:
            self._wake()

    def _fail(self, error: BaseException) -> None:
        if not self._complete and self._error is None:
            self._error = error
            self._stop_timer()
            self._wake()

    def _expire(self) -> None:
        self._timer = None
        self._fail(TimeoutError("the request's deadline passed"))
        self._connection.close()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _wait_headers(self) -> None:
        while not self._headers_done:
            if self._error is not None:
                raise self._error
            await self._wait()


class _Connection(asyncio.Protocol):
    """One TCP connection and the answer it is reading (httptools' callbacks feed that `Response`)."""

    def __init__(self, pool: HttpPool):
        self.pool, self.loop = pool, pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: Response | None = None
        self.closed = False
        self.reused = False
        self.idle_since = 0.0
        self._paused = False
        self.keep_alive = False  # the server keeps the connection after the answer being read
        self._until_eof = False  # the answer has no length: it ends when the server closes

    # -- asyncio.Protocol ------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # create_connection hands its protocol a stream Transport (asyncio's or uvloop's)
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None:  # bytes nobody asked for: the connection is out of step, drop it
            self.close()
            return
        response.started = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            response._fail(UpstreamBroken(f"the upstream answered malformed HTTP: {e}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        response = self.response
        if response is not None and not response.complete:
            if self._until_eof and response._headers_done:
                response._finish()
            else:
                why = f": {exc}" if exc else ""
                response._fail(UpstreamBroken(f"the upstream closed the connection before its answer ended{why}"))
        self.pool._forget(self)

    # -- httptools callbacks: the parser runs only in data_received, which feeds it only while a response is read -

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.response is not None
        self.response.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        assert self.response is not None
        headers = self.response.headers
        self._until_eof = "content-length" not in headers and "chunked" not in headers.get("transfer-encoding", "")
        self.keep_alive = self.parser.should_keep_alive()  # llhttp forgets it once the message is complete
        self.response._headers(self.parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        assert self.response is not None
        self.response._feed(body)

    def on_message_complete(self) -> None:
        assert self.response is not None
        self._until_eof = False
        self.response._finish()

    # -- for the pool and the response: a connection is pooled once connected (connection_made ran) ------------

    def send(self, head: bytes, body: bytes, deadline: float | None) -> Response:
        assert self.transport is not None
        self.response = Response(self, deadline)
        self.transport.write(head + body)
        return self.response

    def finished(self, response: Response) -> None:
        if self.response is not response:
            return
        if response.complete and not self.closed and self.keep_alive:
            self.response = None
            self.resume()
            self.pool._put(self)
        else:
            self.close()

    def pause(self) -> None:
        if not self._paused and not self.closed:
            assert self.transport is not None
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused and not self.closed:
            assert self.transport is not None
            self._paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:  # None while connecting: the pool may close meanwhile (HttpPool.close)
                self.transport.close()
            self.pool._forget(self)


class HttpPool:
    """Keep-alive connections to `host:port` (at most `max_connections` open; a request past it waits for one).
    Belongs to the event loop it is made in."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        tls: bool = False,
        max_connections: int = 256,
        keepalive_s: float = KEEPALIVE_S,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ):
        self.host, self.port = host, port
        #: the TLS context of an https upstream (the system's trust store), None for plain HTTP
        self.tls = ssl.create_default_context() if tls else None
        self.max_connections, self.keepalive_s, self.connect_timeout_s = max_connections, keepalive_s, connect_timeout_s
        self.loop = asyncio.get_running_loop()
        name = f"[{host}]" if ":" in host else host  # an IPv6 address goes in brackets
        self._host_header = f"Host: {name}:{port}\r\n".encode("latin-1")
        self._idle: list[_Connection] = []  # most recently used last
        self._open: set[_Connection] = set()
        self._slot_waiters: collections.deque[asyncio.Future] = collections.deque()
        self.closed = False

    @classmethod
    def for_url(cls, base_url: str, **options) -> HttpPool:
        """The pool for `http://host[:port]` or `https://host[:port]` (a path after it is not allowed)."""
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
            raise ValueError(f"an upstream URL is http(s)://host[:port], not {base_url!r}")
        tls = parts.scheme == "https"
        return cls(parts.hostname, parts.port or (443 if tls else 80), tls=tls, **options)

    @property
    def num_open(self) -> int:
        return len(self._open)

    async def request(
        self, method: str, path: str, body: bytes = b"", content_type: str | None = None, timeout_s: float | None = None
    ) -> Response:
        """Send one request; returns its Response once the status line and headers have arrived. `timeout_s` bounds
        the whole exchange, reading the body included."""
        deadline = None if timeout_s is None else self.loop.time() + timeout_s
        head = self._head(method, path, body, content_type)
        connection = self._take_idle()
        if connection is None:
            connection = await self._connect(deadline)
        response = connection.send(head, body, deadline)
        try:
            await response._wait_headers()
        except UpstreamBroken:
            response.close()
            if not connection.reused or response.started:
                raise  # the server was closing the idle connection as we sent: once more, on a new one
            connection = await self._connect(deadline)
            response = connection.send(head, body, deadline)
            await _headers_or_close(response)
        except BaseException:
            response.close()
            raise
        return response

    def _head(self, method: str, path: str, body: bytes, content_type: str | None) -> bytes:
        lines = [f"{method} {path} HTTP/1.1\r\n".encode("latin-1"), self._host_header]
        if content_type is not None:
            lines.append(f"Content-Type: {content_type}\r\n".encode("latin-1"))
        if body or method in ("POST", "PUT", "PATCH"):
            lines.append(b"Content-Length: %d\r\n" % len(body))
        lines.append(b"\r\n")
        return b"".join(lines)

    def _take_idle(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if connection.closed:
                continue
            if now - connection.idle_since > self.keepalive_s:
                connection.close()
                continue
            connection.reused = True
            return connection
        return None

    async def _connect(self, deadline: float | None) -> _Connection:
        if self.closed:
            raise UpstreamConnectError(f"the connection pool to {self.host}:{self.port} is closed")
        while len(self._open) >= self.max_connections:
            waiter = self.loop.create_future()
            self._slot_waiters.append(waiter)
            try:
                await _until(waiter, deadline, self.loop)
            finally:
                if waiter in self._slot_waiters:
                    self._slot_waiters.remove(waiter)
            idle = self._take_idle()
            if idle is not None:
                return idle
        timeout = self.connect_timeout_s
        if deadline is not None:
            timeout = min(timeout, max(deadline - self.loop.time(), 0.0))
        connection = _Connection(self)
        self._open.add(connection)
        try:
            async with asyncio.timeout(timeout):
                await self.loop.create_connection(lambda: connection, self.host, self.port, ssl=self.tls)
        except TimeoutError:
            self._forget(connection)
            if deadline is not None and self.loop.time() >= deadline:
                raise
            raise UpstreamConnectError(
                f"connecting to {self.host}:{self.port} took longer than {timeout:g} s"
            ) from None
        except OSError as e:
            self._forget(connection)
            raise UpstreamConnectError(f"cannot connect to {self.host}:{self.port}: {e}") from None
        except BaseException:
            self._forget(connection)
            raise
        return connection

    def _put(self, connection: _Connection) -> None:
        if self.closed:
            connection.close()
            return
        connection.idle_since = time.monotonic()
        self._idle.append(connection)
        self._wake_one()

    def _forget(self, connection: _Connection) -> None:
        if connection in self._open:
            self._open.discard(connection)
            self._wake_one()

    def _wake_one(self) -> None:
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def close(self) -> None:
        self.closed = True
        for connection in list(self._open):
            connection.close()
        self._idle.clear()


async def _headers_or_close(response: Response) -> None:
    try:
        await response._wait_headers()
    except BaseException:
        response.close()
        raise


async def _until(future: asyncio.Future, deadline: float | None, loop) -> None:
    """Await `future`, TimeoutError once `deadline` passes."""
    if deadline is None:
        await future
        return
    handle = loop.call_at(
        deadline, lambda: future.done() or future.set_exception(TimeoutError("the request's deadline passed"))
    )
    try:
        await future
    finally:
        handle.cancel()
