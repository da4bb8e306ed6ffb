"""A TCP relay: one more process between a benchmark's client and its upstream, doing nothing but copy bytes.

What it adds to a request's latency, and takes from streaming throughput, is what any extra hop costs on the machine
(a process of its own to wake and schedule, two more loopback sockets) before any work is done: subtracted from what
the gateway adds, it leaves the gateway's own work (bench/openai_upstream.py). Copies are flow-controlled (a side
whose peer cannot take more stops being read), and a connection closing closes its peer.

    python -m bench.tcp_relay --port 9000 --to 127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import asyncio
from typing import cast


class _Side(asyncio.Protocol):
    """One connection of a relayed pair; `peer` is the other."""

    def __init__(self):
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream's protocol is handed a Transport (asyncio's or uvloop's)
        self.transport = cast(asyncio.Transport, transport)

    def peer_transport(self) -> asyncio.Transport:
        """The other side's transport: bytes flow only once the pair is joined, both sides connected."""
        assert self.peer is not None and self.peer.transport is not None
        return self.peer.transport

    def data_received(self, data):
        self.peer_transport().write(data)

    def pause_writing(self):  # this side's send buffer is full: stop reading what would fill it further
        self.peer_transport().pause_reading()

    def resume_writing(self):
        self.peer_transport().resume_reading()

    def connection_lost(self, exc):
        if self.peer is not None:
            self.peer_transport().close()


class _Accepted(_Side):
    """A client's connection: what it sends before its upstream connection is open waits for it."""

    def __init__(self, host: str, port: int):
        super().__init__()
        self.host, self.port = host, port
        self._early: list[bytes] = []

    def connection_made(self, transport):
        super().connection_made(transport)
        asyncio.ensure_future(self._connect())

    def data_received(self, data):
        if self.peer is None:
            self._early.append(data)
        else:
            self.peer_transport().write(data)

    async def _connect(self):
        assert self.transport is not None  # connection_made, which starts this, set it
        try:
            upstream_transport, upstream = await asyncio.get_running_loop().create_connection(
                _Side, self.host, self.port
            )
        except OSError:
            self.transport.close()
            return
        if self.transport.is_closing():  # the client left while the upstream connection opened
            upstream_transport.close()
            return
        upstream.peer, self.peer = self, upstream
        for data in self._early:
            upstream_transport.write(data)
        self._early.clear()


async def relay(port: int, host: str, upstream_port: int) -> None:
    server = await asyncio.get_running_loop().create_server(lambda: _Accepted(host, upstream_port), "127.0.0.1", port)
    await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="port to listen on (127.0.0.1)")
    parser.add_argument("--to", required=True, help="host:port to relay to")
    args = parser.parse_args(argv)
    host, _, upstream_port = args.to.rpartition(":")
    try:
        import uvloop  # the loop the gateway runs on, so the hop is compared like for like

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    run(relay(args.port, host, int(upstream_port)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
