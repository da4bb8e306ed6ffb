"""POST /v1/completions — OpenAI text completions, whole or as SSE."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.gateway.dependencies import CallerDep, DispatcherDep, sse, until_disconnect
from service.gateway.dispatch import new_request_id
from service.gateway.schemas import CompletionRequest
from service.gateway.streaming import GENERATION_RESPONSES, sse_response, usage
from service.gateway.worker_client import Chunk, GenerationRequest

router = APIRouter()


@router.post("/v1/completions", responses=GENERATION_RESPONSES)
async def create_completion(body: CompletionRequest, request: Request, dispatcher: DispatcherDep, caller: CallerDep):
    model, _ = dispatcher.resolve_model(body.model)
    req = GenerationRequest(request_id=new_request_id("cmpl"), model=model, prompt=body.prompt_text,
                            max_tokens=body.max_tokens, **body.sampling())  # fmt: skip
    created = int(time.time())
    if not body.stream:
        text, last = await until_disconnect(request, dispatcher.complete(req, "completions", caller))
        return JSONResponse({
            "id": req.request_id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": last.finish_reason}],
            "usage": usage(last),
        })  # fmt: skip

    chunks = dispatcher.generate(req, "completions", caller=caller)
    # errors before the first token are plain HTTP errors (400, 429, 503), not stream events
    first = await until_disconnect(request, anext(chunks))

    def frame(chunk: Chunk) -> bytes:
        payload = {"id": req.request_id, "object": "text_completion", "created": created, "model": model,
                   "choices": [{"index": 0, "text": chunk.text, "logprobs": None, "finish_reason": chunk.finish_reason}]}  # fmt: skip
        if body.include_usage:
            payload["usage"] = None
        return sse(payload)

    def usage_event(last: Chunk) -> bytes:
        return sse({"id": req.request_id, "object": "text_completion", "created": created, "model": model,
                    "choices": [], "usage": usage(last)})  # fmt: skip

    return sse_response(first, chunks, lambda c: [frame(c)], frame, usage_event if body.include_usage else None)
