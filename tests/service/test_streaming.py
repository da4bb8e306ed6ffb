"""The SSE response (service/gateway/streaming.py EventStreamResponse): a client that disconnects ends the stream
quietly and closes what it was streaming; a cancellation from elsewhere still propagates. In memory, with ASGI
callables standing in for the server."""

from __future__ import annotations

import asyncio

import pytest

from service.gateway.streaming import EventStreamResponse


class Endless:
    """An SSE body that never ends on its own; `closed` once its generator has been closed."""

    def __init__(self):
        self.sent, self.closed = 0, False

    async def events(self):
        try:
            while True:
                self.sent += 1
                yield b"data: {}\n\n"
                await asyncio.sleep(0.001)
        finally:
            self.closed = True


def server(disconnect_after_s: float | None):
    """(receive, send, sent messages): receive says http.disconnect after `disconnect_after_s` (None: never)."""
    sent = []

    async def receive():
        if disconnect_after_s is None:
            await asyncio.Event().wait()  # never set
        else:
            await asyncio.sleep(disconnect_after_s)
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    return receive, send, sent


def test_a_client_that_disconnects_ends_the_stream_quietly():
    body = Endless()
    receive, send, sent = server(disconnect_after_s=0.05)

    async def run():
        await EventStreamResponse(body.events(), media_type="text/event-stream")({"type": "http"}, receive, send)
        task = asyncio.current_task()
        assert task is not None
        return task.cancelling()

    assert asyncio.run(run()) == 0  # returned normally, nothing left pending on the task
    assert body.closed and body.sent > 1 and sent[0]["type"] == "http.response.start"


def test_a_cancellation_from_elsewhere_propagates():
    body = Endless()
    receive, send, _ = server(disconnect_after_s=None)

    async def run():
        task = asyncio.ensure_future(EventStreamResponse(body.events())({"type": "http"}, receive, send))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert body.closed
