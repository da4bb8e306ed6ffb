"""n sequences from a model that makes one per request: n requests of one sequence, their chunks merged into one stream.

A stock Triton model (TensorRT-LLM's ensemble or LLM-API model) declares no `num_return_sequences`, so the dispatcher
asks it for n > 1 sequences as n child requests, as vLLM's parallel sampling does (vllm/v1/engine/parallel_sampling.py
`ParentRequest`): child i is the request with n = 1, the id `<id>-<i>` and, when seeded, seed + i, so the choices
differ and a seeded request repeats itself. The price is the prompt: each child prefills it again (n prefills instead
of one forked KV cache), and the children may be batched apart. To the caller the stream is the one a worker that
takes n sends: chunks interleaved as they come, each with its child's index as `Chunk.index`, and only the last chunk
of all `final`. A failing child fails the request and cancels the others.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, Callable

from service.gateway.worker_client import Chunk, GenerationRequest, WorkerError

#: seeds travel as UINT64: seed + i wraps around rather than overflow the tensor
_SEED_MODULUS = 2**64

Call = Callable[[GenerationRequest, float], AsyncGenerator[Chunk, None]]


def child_requests(req: GenerationRequest) -> list[GenerationRequest]:
    """The n requests of one sequence each that stand for `req`."""
    return [
        dataclasses.replace(
            req,
            n=1,
            request_id=f"{req.request_id}-{i}",
            seed=None if req.seed is None else (req.seed + i) % _SEED_MODULUS,
        )
        for i in range(req.n)
    ]


async def fan_out(call: Call, req: GenerationRequest, timeout_s: float) -> AsyncGenerator[Chunk, None]:
    """`req`'s sequences, each asked for with `call` (a client's `generate` or `infer`) as a request of its own, in
    the order their chunks arrive; closing the iterator cancels every child call."""
    arrived: asyncio.Queue[Chunk | Exception] = asyncio.Queue()

    async def pump(index: int, child: GenerationRequest) -> None:
        stream, ended = call(child, timeout_s), False
        try:
            async for chunk in stream:
                chunk.index, ended = index, chunk.final
                await arrived.put(chunk)
            if not ended:  # every client ends a call with its final chunk, or raises
                raise WorkerError("UNAVAILABLE", f"request {child.request_id} ended before its final response")
        except Exception as e:
            await arrived.put(e)
        finally:
            await stream.aclose()

    tasks = [asyncio.create_task(pump(i, child)) for i, child in enumerate(child_requests(req))]
    num_running = len(tasks)
    try:
        while num_running:
            item = await arrived.get()
            if isinstance(item, Exception):
                raise item
            num_running -= item.final
            item.final = num_running == 0
            yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
