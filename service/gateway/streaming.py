"""The SSE stream shared by /v1/completions and /v1/chat/completions.

OpenAI's framing: one `data:` event per chunk, each carrying its choice's `index` (a request's n choices
interleave), an optional usage-only chunk (`stream_options.include_usage`) for all of them, then `data: [DONE]`. A
failure after the first token can no longer change the status code, so it becomes an error event inside the
stream. The routers only say how a chunk is framed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from typing import Any

from fastapi.responses import StreamingResponse

from deepspec_protocol.worker import RequestStats
from service.gateway.dependencies import SSE_DONE, SSE_HEADERS, sse
from service.gateway.errors import ServiceError, responses
from service.gateway.worker_client import Chunk, total_stats

#: OpenAPI responses of a route that answers JSON, or SSE when the body says `"stream": true`
GENERATION_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the completion (JSON), or its chunks as server-sent events ending in `data: [DONE]`",
        "content": {
            "application/json": {},
            "text/event-stream": {
                "schema": {  # one server-sent event
                    "type": "object",
                    "required": ["data"],
                    "properties": {"data": {"type": "string", "description": "a JSON chunk, or [DONE] last"}},
                }
            },
        },
    },
    **responses(400, 401, 404, 413, 429, 503, 504),
}


def usage(*totals: RequestStats) -> dict:
    """OpenAI's usage of one request's `total_stats`, or of several requests' (a batch of prompts) summed: so each
    prompt counts once however many choices it has (as at OpenAI and vLLM), and every choice's completion tokens.

    DeepSpec's extension, `speculation`, says what speculation did for the request, as the gRPC API's Usage does:
    draft tokens proposed, those the target accepted, and, where the worker counts them, the verify rounds that had
    drafts and their mean tokens committed (accepted + 1 each: the acceptance length). Present only where drafts
    were proposed: an OpenAI
    upstream reports no draft counts, and zeros there would claim a speculation it may well have done. OpenAI's
    `completion_tokens_details.accepted_prediction_tokens` is left alone: it counts a caller's Predicted Output."""
    prompt = sum(t.num_prompt_tokens for t in totals)
    completion = sum(t.num_output_tokens for t in totals)
    body: dict[str, object] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    drafted = sum(t.num_draft_tokens for t in totals)
    if drafted:
        accepted, rounds = sum(t.num_accepted_tokens for t in totals), sum(t.num_spec_steps for t in totals)
        spec: dict[str, float] = {"draft_tokens": drafted, "accepted_tokens": accepted}
        if rounds:  # a Triton LLM-API model reports totals, not rounds
            spec |= {"drafted_rounds": rounds, "acceptance_length": round((accepted + rounds) / rounds, 4)}
        body["speculation"] = spec
    return body


class EventStreamResponse(StreamingResponse):
    """A StreamingResponse that streams in the request's own task, while a watcher task waits for the client to
    disconnect and then cancels it; the stream ends quietly, as Starlette's does. (Starlette runs the two under an
    anyio task group, which costs a stream more than the framing of its chunks.)"""

    async def __call__(self, scope, receive, send) -> None:
        streaming, left = asyncio.current_task(), False
        assert streaming is not None  # Starlette runs each request in a task

        async def watch():
            nonlocal left
            while (await receive())["type"] != "http.disconnect":
                pass
            left = True
            streaming.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not left or streaming.cancelling() > 1:  # cancelled by someone else (too): theirs to handle
                raise
            streaming.uncancel()
        finally:
            watcher.cancel()


def sse_response(
    first: Chunk,
    chunks: AsyncGenerator[Chunk, None],
    opening: Callable[[Chunk], list[bytes]],  # the events for the first chunk
    frame: Callable[[Chunk], bytes],  # the event for every later chunk
    usage_event: Callable[[RequestStats], bytes] | None,  # the usage-only event (of total_stats), when asked for
) -> StreamingResponse:
    async def events():
        latest = {first.index: first.stats}  # sequence index -> its counts so far
        try:
            for event in opening(first):
                yield event
            async for chunk in chunks:
                latest[chunk.index] = chunk.stats
                yield frame(chunk)
        except ServiceError as e:
            yield sse(e.body())
            yield SSE_DONE
            return
        finally:
            await chunks.aclose()
        if usage_event is not None:
            yield usage_event(total_stats(latest.values()))
        yield SSE_DONE

    return EventStreamResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)
