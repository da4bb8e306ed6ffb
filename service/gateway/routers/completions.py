"""POST /v1/completions — OpenAI text completions, whole or as SSE; a batch of prompts (texts or token-id lists)
gives one choice per prompt, each its own worker request; `echo` with `logprobs` and `max_tokens: 0` scores a prompt
in one prefill (what lm-eval's log-likelihood tasks send)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.gateway.dependencies import CallerDep, DispatcherDep, sse, until_disconnect
from service.gateway.dispatch import new_request_id
from service.gateway.logprobs import completion_logprobs, concat
from service.gateway.schemas import CompletionRequest
from service.gateway.streaming import GENERATION_RESPONSES, sse_response, usage
from service.gateway.worker_client import Chunk, GenerationRequest

router = APIRouter()


def echoed(prompt: str | list[int], chunk: Chunk) -> str:
    """The prompt as a choice echoes it: the text as sent, or what the worker decoded token ids to."""
    if isinstance(prompt, str):
        return prompt
    return "".join(s.token for s in chunk.prompt_logprobs or ())


@router.post("/v1/completions", responses=GENERATION_RESPONSES)
async def create_completion(body: CompletionRequest, request: Request, dispatcher: DispatcherDep, caller: CallerDep):
    model, _ = dispatcher.resolve_model(body.model)
    request_id, prompts = new_request_id("cmpl"), body.prompts
    reqs = [GenerationRequest(request_id=request_id if len(prompts) == 1 else f"{request_id}-{i}", model=model,
                              **body.generation(prompt)) for i, prompt in enumerate(prompts)]  # fmt: skip
    created = int(time.time())
    if not body.stream:
        results = await until_disconnect(request, dispatcher.complete_all(reqs, "completions", caller))
        choices = []
        for index, (prompt, result) in enumerate(zip(prompts, results)):
            echo = echoed(prompt, result) if body.echo else ""
            logprobs = None
            if body.logprobs is not None:
                logprobs = concat(completion_logprobs((result.prompt_logprobs or []) if body.echo else []),
                                  completion_logprobs(result.logprobs or [], len(echo)))
            choices.append({"index": index, "text": echo + result.text, "logprobs": logprobs,
                            "finish_reason": result.finish_reason})
        return JSONResponse({"id": request_id, "object": "text_completion", "created": created, "model": model,
                             "choices": choices, "usage": usage(*results)})  # fmt: skip

    chunks = dispatcher.generate(reqs[0], "completions", caller=caller)
    # errors before the first token are plain HTTP errors (400, 429, 503), not stream events
    first = await until_disconnect(request, anext(chunks))
    sent = 0  # characters of the choice's text streamed so far: where the next chunk's text_offset starts

    def event(text: str, scores, finish_reason: str | None) -> bytes:
        nonlocal sent
        logprobs = None if body.logprobs is None else completion_logprobs(scores or [], sent)
        sent += len(text)
        payload = {"id": request_id, "object": "text_completion", "created": created, "model": model,
                   "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}]}  # fmt: skip
        if body.include_usage:
            payload["usage"] = None
        return sse(payload)

    def opening(first: Chunk) -> list[bytes]:
        echo = [event(echoed(prompts[0], first), first.prompt_logprobs, None)] if body.echo else []
        return [*echo, frame(first)]

    def frame(chunk: Chunk) -> bytes:
        return event(chunk.text, chunk.logprobs, chunk.finish_reason)

    def usage_event(last: Chunk) -> bytes:
        return sse({"id": request_id, "object": "text_completion", "created": created, "model": model,
                    "choices": [], "usage": usage(last)})  # fmt: skip

    return sse_response(first, chunks, opening, frame, usage_event if body.include_usage else None)
