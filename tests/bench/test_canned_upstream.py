"""bench.canned_upstream is an OpenAI upstream the gateway's own client reads: its model, a whole completion and a
stream of NUM_TOKENS one-token chunks with the usage, over one keep-alive connection."""

from __future__ import annotations

import asyncio

from bench.canned_upstream import MODEL, NUM_TOKENS, serve
from service.gateway.openai_client import OpenAIClient
from service.gateway.worker_client import GenerationRequest
from tests.ports import free_port

REQ = GenerationRequest(request_id="r1", model=MODEL, prompt="hi", max_tokens=NUM_TOKENS)


def test_the_gateways_client_reads_its_models_whole_answers_and_streams():
    async def run():
        port = free_port()
        serving = asyncio.ensure_future(serve(port))
        client = OpenAIClient("canned", f"http://127.0.0.1:{port}")
        try:
            for _ in range(100):  # the socket opens on the loop's next turns
                try:
                    models = await client.model_info(1.0)
                    break
                except Exception:
                    await asyncio.sleep(0.01)
            whole = [chunk async for chunk in client.infer(REQ, 5.0)]
            streams = [[chunk async for chunk in client.generate(REQ, 5.0)] for _ in range(2)]
            return models, whole, streams
        finally:
            await client.close()
            serving.cancel()

    models, whole, streams = asyncio.run(run())
    assert models == {MODEL: 2048}
    assert [(c.text, c.finish_reason, c.stats.num_output_tokens) for c in whole] == [
        ("a" * NUM_TOKENS, "length", NUM_TOKENS)
    ]
    for chunks in streams:
        assert "".join(c.text for c in chunks) == "a" * NUM_TOKENS and len(chunks) == NUM_TOKENS
        assert chunks[-1].final and chunks[-1].stats.num_output_tokens == NUM_TOKENS
