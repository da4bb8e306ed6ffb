"""Test servers: the fake OpenAI server on a background thread.

Tests are plain functions that call `asyncio.run(...)` (no pytest-asyncio needed); a server that must outlive one
`asyncio.run` (CLI tests, where `main()` runs its own loop) lives on a thread via `threaded_fake_server`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

from loadtest.fake_server import FakeOpenAIServer, FakeServerConfig


@contextlib.contextmanager
def threaded_fake_server(config: FakeServerConfig | None = None) -> Iterator[FakeOpenAIServer]:
    """A FakeOpenAIServer on its own loop in a daemon thread; stopped (and the thread joined) on exit."""
    srv = FakeOpenAIServer(config)
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(srv.start())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(srv.aclose())
        loop.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    assert ready.wait(10), "fake server did not start"
    try:
        yield srv
    finally:
        loop.call_soon_threadsafe(loop.stop)
        t.join(10)
