"""POST /v1/chat/completions — OpenAI chat, whole or as SSE; the worker applies the target's chat template."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from service.gateway.dependencies import (SSE_DONE, SSE_HEADERS, ClientDisconnected, DispatcherDep, sse,
                                          until_disconnect)  # fmt: skip
from service.gateway.dispatch import new_request_id
from service.gateway.errors import ServiceError
from service.gateway.routers.completions import usage
from service.gateway.schemas import ChatCompletionRequest
from service.gateway.worker_client import Chunk, GenerationRequest

router = APIRouter()


@router.post("/v1/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, request: Request, dispatcher: DispatcherDep):
    model, _ = dispatcher.resolve_model(body.model)
    req = GenerationRequest(request_id=new_request_id("chatcmpl"), model=model, messages=body.messages_dicts(),
                            max_tokens=body.max_completion_tokens or body.max_tokens, **body.sampling())  # fmt: skip
    created = int(time.time())
    if not body.stream:
        try:
            text, last = await until_disconnect(request, dispatcher.complete(req, "chat"))
        except ClientDisconnected:
            return Response(status_code=499)
        return JSONResponse({
            "id": req.request_id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": last.finish_reason}],
            "usage": usage(last),
        })  # fmt: skip

    chunks = dispatcher.generate(req, "chat")
    try:
        first = await until_disconnect(request, anext(chunks))
    except ClientDisconnected:
        return Response(status_code=499)

    def frame(delta: dict, finish_reason: str | None = None) -> bytes:
        payload = {"id": req.request_id, "object": "chat.completion.chunk", "created": created, "model": model,
                   "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}  # fmt: skip
        if body.include_usage:
            payload["usage"] = None
        return sse(payload)

    async def events():
        last: Chunk = first
        try:
            yield frame({"role": "assistant", "content": ""})
            yield frame({"content": first.text}, first.finish_reason)
            async for last in chunks:
                yield frame({"content": last.text} if last.text or not last.finish_reason else {}, last.finish_reason)
        except ServiceError as e:
            yield sse(e.body())
            yield SSE_DONE
            return
        finally:
            await chunks.aclose()
        if body.include_usage:
            yield sse({"id": req.request_id, "object": "chat.completion.chunk", "created": created, "model": model,
                       "choices": [], "usage": usage(last)})  # fmt: skip
        yield SSE_DONE

    return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)
