"""Shared pieces of the routers: the gateway state, the caller, client-disconnect handling, JSON bodies and SSE
framing."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import Depends, Request
from fastapi.responses import Response

from service.gateway.dispatch import Dispatcher
from service.gateway.errors import ClientDisconnected
from service.gateway.json_codec import dumps
from service.gateway.validation import check_session_id


async def get_dispatcher(request: Request) -> Dispatcher:  # async: a sync dependency would hop to a thread
    return request.app.state.gateway.dispatcher


DispatcherDep = Annotated[Dispatcher, Depends(get_dispatcher)]


async def get_caller(request: Request) -> str | None:
    """Who sent the request: the identity of its API key, as `GuardMiddleware` found it (None with auth off)."""
    return request.scope.get("state", {}).get("caller")


CallerDep = Annotated[str | None, Depends(get_caller)]

#: the header naming the conversation a request belongs to: its turns stay on one worker (routing.py)
SESSION_HEADER = "x-session-id"
_SESSION_HEADER_BYTES = SESSION_HEADER.encode()  # ASGI header names are lower-case bytes


async def get_session(request: Request) -> str | None:
    """The request's `x-session-id` header (BadRequestError when it is not printable text of a sane length). Read
    off the ASGI scope: Starlette's `request.headers` builds a mapping of every header first."""
    for name, value in request.scope["headers"]:
        if name == _SESSION_HEADER_BYTES and value:
            return check_session_id(value.decode("latin-1"))
    return None


SessionDep = Annotated[str | None, Depends(get_session)]


async def until_disconnect(request: Request, awaitable):
    """Await `awaitable` in this task, cancelling it (and so the worker's sequence) if the client disconnects first.
    In this task rather than a task of its own: a task per request was a tenth of what the gateway spent on a whole
    completion against a fast upstream. The watcher cancels this task only while `awaitable` runs (`running`), and
    a cancellation it did not cause (the server's, the drain's) goes on as it came."""
    task = asyncio.current_task()
    assert task is not None  # Starlette runs each request in a task
    watch = asyncio.ensure_future(_wait_for_disconnect(request))
    running, disconnected = True, False

    def on_disconnect(done: asyncio.Future) -> None:
        nonlocal disconnected
        if running and not done.cancelled() and done.exception() is None:
            disconnected = True
            task.cancel()

    watch.add_done_callback(on_disconnect)
    try:
        return await awaitable
    except asyncio.CancelledError:
        if disconnected and task.uncancel() == 0:  # `awaitable` has wound down: it was awaited to its end
            raise ClientDisconnected from None
        raise
    finally:
        running = False
        watch.remove_done_callback(on_disconnect)
        watch.cancel()


async def _wait_for_disconnect(request: Request) -> None:
    # Once the body is read, uvicorn's receive() blocks until the connection closes.
    while (await request.receive())["type"] != "http.disconnect":
        pass


def json_response(payload: dict) -> Response:
    """A 200 answer with `payload` as its JSON body (JSONResponse's, encoded by orjson)."""
    return Response(dumps(payload), media_type="application/json")


def sse(payload: dict) -> bytes:
    return b"data: " + dumps(payload) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
