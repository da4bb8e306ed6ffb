"""POST /v1/chat/completions — OpenAI chat, whole or as SSE; the worker applies the target's chat template. With
`logprobs` each chunk carries the logprobs of the tokens whose text it carries (service/worker/token_texts.py).
With `n` the answer has n choices (`index` 0..n-1), each with its own text, logprobs and finish_reason; streamed,
their chunks interleave, each naming its choice, and each choice opens with its role chunk, as vLLM streams them."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request

from deepspec_protocol.worker import RequestStats
from service.gateway.dependencies import CallerDep, DispatcherDep, SessionDep, json_response, sse, until_disconnect
from service.gateway.dispatch import new_request_id
from service.gateway.logprobs import chat_logprobs
from service.gateway.schemas import ChatCompletionRequest
from service.gateway.streaming import GENERATION_RESPONSES, sse_response, usage
from service.gateway.worker_client import Chunk, GenerationRequest, total_stats

router = APIRouter()


@router.post("/v1/chat/completions", responses=GENERATION_RESPONSES)
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, dispatcher: DispatcherDep, caller: CallerDep, session: SessionDep
):
    model, _ = dispatcher.resolve_model(body.model)
    req = GenerationRequest(request_id=new_request_id("chatcmpl"), model=model, **body.generation())
    req.session = session or req.session  # the header before `user`
    created = int(time.time())

    def logprobs(chunk: Chunk) -> dict | None:
        return chat_logprobs(chunk.logprobs or []) if body.logprobs else None

    if not body.stream:
        results = await until_disconnect(request, dispatcher.complete(req, "chat", caller))
        return json_response(
            {
                "id": req.request_id,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": result.index,
                        "message": {"role": "assistant", "content": result.text},
                        "logprobs": logprobs(result),
                        "finish_reason": result.finish_reason,
                    }
                    for result in results
                ],
                "usage": usage(total_stats(result.stats for result in results)),
            }
        )

    chunks = dispatcher.generate(req, "chat", caller=caller)
    first = await until_disconnect(request, anext(chunks))

    def frame(index: int, delta: dict, chunk: Chunk | None = None) -> bytes:
        """One chunk event of choice `index`; `chunk` None for a role chunk, which carries no token."""
        payload = {
            "id": req.request_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": index,
                    "delta": delta,
                    "logprobs": None if chunk is None else logprobs(chunk),
                    "finish_reason": None if chunk is None else chunk.finish_reason,
                }
            ],
        }
        if body.include_usage:
            payload["usage"] = None
        return sse(payload)

    def opening(first: Chunk) -> list[bytes]:
        roles = [frame(index, {"role": "assistant", "content": ""}) for index in range(req.n)]
        return [*roles, frame(first.index, {"content": first.text}, first)]

    def later(chunk: Chunk) -> bytes:
        return frame(chunk.index, {"content": chunk.text} if chunk.text or not chunk.finish_reason else {}, chunk)

    def usage_event(total: RequestStats) -> bytes:
        return sse(
            {
                "id": req.request_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [],
                "usage": usage(total),
            }
        )

    return sse_response(first, chunks, opening, later, usage_event if body.include_usage else None)
