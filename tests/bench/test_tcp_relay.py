"""bench.tcp_relay: bytes go through both ways unchanged, those a client sends before the relay's upstream connection
is open included (uvloop hands them over even to a connection that paused reading), and a side that closes closes the
other."""

from __future__ import annotations

import asyncio

import uvloop

from bench.tcp_relay import relay
from tests.ports import free_port


async def _echo_upper(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1024):
        writer.write(data.upper())
        await writer.drain()
    writer.close()


async def _through_relay(check) -> None:
    upstream = await asyncio.start_server(_echo_upper, "127.0.0.1", 0)
    port = free_port()
    serving = asyncio.ensure_future(relay(port, "127.0.0.1", upstream.sockets[0].getsockname()[1]))
    try:
        for _ in range(100):  # the relay's socket opens on the loop's next turns
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                break
            except OSError:
                await asyncio.sleep(0.01)
        await check(reader, writer)
    finally:
        serving.cancel()
        upstream.close()


def test_bytes_sent_at_once_arrive_in_full_and_back():
    async def check(reader, writer):
        writer.write(b"hello " * 10_000)  # sent before the relay's upstream connection can be open
        await writer.drain()
        assert await reader.readexactly(60_000) == b"HELLO " * 10_000
        writer.close()

    uvloop.run(_through_relay(check))  # the loop the relay runs on


def test_a_client_that_closes_closes_the_upstream_side_and_back():
    async def check(reader, writer):
        writer.write(b"ab")
        assert await reader.readexactly(2) == b"AB"
        writer.write_eof()  # the upstream sees the end, closes, and the relay closes the client's side
        assert await asyncio.wait_for(reader.read(), 5) == b""

    uvloop.run(_through_relay(check))  # the loop the relay runs on
