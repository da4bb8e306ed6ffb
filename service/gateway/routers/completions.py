"""POST /v1/completions — OpenAI text completions, whole or as SSE; a batch of prompts (texts or token-id lists)
gives n choices per prompt, each prompt its own worker request (prompt i's choice j has `index` i * n + j, as at
OpenAI and vLLM); `echo` with `logprobs` and `max_tokens: 0` scores a prompt in one prefill (what lm-eval's
log-likelihood tasks send). Streamed, the n choices' chunks interleave, each naming its choice, with its own
`text_offset`s and finish_reason."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request

from deepspec_protocol.token_scores import TokenScore
from deepspec_protocol.worker import RequestStats
from service.gateway.dependencies import CallerDep, DispatcherDep, SessionDep, json_response, sse, until_disconnect
from service.gateway.dispatch import new_request_id
from service.gateway.logprobs import completion_logprobs, concat
from service.gateway.schemas import CompletionRequest
from service.gateway.streaming import GENERATION_RESPONSES, sse_response, usage
from service.gateway.worker_client import Chunk, GenerationRequest, total_stats

router = APIRouter()


def echoed(prompt: str | list[int], prompt_scores: list[TokenScore] | None) -> str:
    """The prompt as a choice echoes it: the text as sent, or what the worker decoded token ids to."""
    if isinstance(prompt, str):
        return prompt
    return "".join(s.token for s in prompt_scores or ())


def prompt_scores_of(results: list[Chunk]) -> list[TokenScore] | None:
    """The scores of the prompt that `results` (one prompt's choices) continue: a worker may send them with one
    sequence only, and they hold for all."""
    return next((r.prompt_logprobs for r in results if r.prompt_logprobs is not None), None)


def choices_of(body: CompletionRequest, prompt: str | list[int], results: list[Chunk], first_index: int) -> list[dict]:
    """One prompt's choices, whole, numbered from `first_index`."""
    prompt_scores = prompt_scores_of(results)
    echo = echoed(prompt, prompt_scores) if body.echo else ""
    choices = []
    for result in results:
        logprobs = None
        if body.logprobs is not None:
            logprobs = concat(
                completion_logprobs((prompt_scores or []) if body.echo else []),
                completion_logprobs(result.logprobs or [], len(echo)),
            )
        choices.append(
            {
                "index": first_index + result.index,
                "text": echo + result.text,
                "logprobs": logprobs,
                "finish_reason": result.finish_reason,
            }
        )
    return choices


@router.post("/v1/completions", responses=GENERATION_RESPONSES)
async def create_completion(
    body: CompletionRequest, request: Request, dispatcher: DispatcherDep, caller: CallerDep, session: SessionDep
):
    model, _ = dispatcher.resolve_model(body.model)
    request_id, prompts = new_request_id("cmpl"), body.prompts
    reqs = [
        GenerationRequest(
            request_id=request_id if len(prompts) == 1 else f"{request_id}-{i}", model=model, **body.generation(prompt)
        )
        for i, prompt in enumerate(prompts)
    ]
    for req in reqs:
        req.session = session or req.session  # the header before `user`
    created = int(time.time())
    if not body.stream:
        results = await until_disconnect(request, dispatcher.complete_all(reqs, "completions", caller))
        choices = [
            choice
            for i, (prompt, group) in enumerate(zip(prompts, results))
            for choice in choices_of(body, prompt, group, i * body.n)
        ]
        return json_response(
            {
                "id": request_id,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": choices,
                "usage": usage(*(total_stats(c.stats for c in group) for group in results)),
            }
        )

    chunks = dispatcher.generate(reqs[0], "completions", caller=caller)
    # errors before the first token are plain HTTP errors (400, 429, 503), not stream events
    first = await until_disconnect(request, anext(chunks))
    sent: dict[int, int] = {}  # choice -> characters of its text streamed so far: its next text_offset

    def event(index: int, text: str, scores, finish_reason: str | None) -> bytes:
        offset = sent.get(index, 0)
        logprobs = None if body.logprobs is None else completion_logprobs(scores or [], offset)
        sent[index] = offset + len(text)
        payload = {
            "id": request_id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}],
        }
        if body.include_usage:
            payload["usage"] = None
        return sse(payload)

    def opening(first: Chunk) -> list[bytes]:
        echo = (
            [
                event(index, echoed(prompts[0], first.prompt_logprobs), first.prompt_logprobs, None)
                for index in range(body.n)
            ]
            if body.echo
            else []
        )
        return [*echo, frame(first)]

    def frame(chunk: Chunk) -> bytes:
        return event(chunk.index, chunk.text, chunk.logprobs, chunk.finish_reason)

    def usage_event(total: RequestStats) -> bytes:
        return sse(
            {
                "id": request_id,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [],
                "usage": usage(total),
            }
        )

    return sse_response(first, chunks, opening, frame, usage_event if body.include_usage else None)
