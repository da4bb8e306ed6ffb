"""The HTTP usage object's `speculation` extension (service/gateway/streaming.py `usage`): the draft counts the
worker reports for the request, in whole responses and in the streamed usage chunk, absent where nothing drafted."""

from __future__ import annotations

import asyncio
import json

import pytest

from deepspec_protocol.worker import RequestStats
from service.gateway.streaming import usage
from service.worker.server import WorkerService
from service.worker.settings import WorkerSettings
from tests.service.conftest import in_process_gateway

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox"  # the stub's drafter hits on repeats


def test_usage_sums_the_draft_counts_of_every_prompt():
    one = RequestStats(
        num_prompt_tokens=5, num_output_tokens=10, num_draft_tokens=12, num_accepted_tokens=6, num_spec_steps=3
    )
    two = RequestStats(
        num_prompt_tokens=4, num_output_tokens=6, num_draft_tokens=4, num_accepted_tokens=4, num_spec_steps=1
    )
    assert usage(one, two) == {
        "prompt_tokens": 9,
        "completion_tokens": 16,
        "total_tokens": 25,
        "speculation": {"draft_tokens": 16, "accepted_tokens": 10, "drafted_rounds": 4, "acceptance_length": 3.5},
    }
    # a Triton LLM-API model counts drafts but not rounds
    assert usage(RequestStats(num_prompt_tokens=1, num_output_tokens=2, num_draft_tokens=3, num_accepted_tokens=2))[
        "speculation"
    ] == {"draft_tokens": 3, "accepted_tokens": 2}
    # no drafts (speculation off, or an OpenAI upstream that reports none): OpenAI's usage, nothing more
    assert usage(RequestStats(num_prompt_tokens=3, num_output_tokens=2)) == {
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "total_tokens": 5,
    }


async def _ask(bodies: list[dict]) -> list:
    worker = WorkerService(
        WorkerSettings(target="stub", host="127.0.0.1", port=0, metrics_port=-1, drain_timeout_s=0, stub_step_ms=1)
    )
    await worker.start()
    try:
        async with in_process_gateway(f"127.0.0.1:{worker.port}", "the stub worker") as (client, _):
            return [await client.post("/v1/completions", json=body) for body in bodies]
    finally:
        await worker.stop()


def _streamed_usage(text: str) -> dict:
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    return next(e["usage"] for e in events if e.get("usage"))


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_the_gateway_reports_what_the_worker_drafted(mode):
    base = {"model": "stub", "prompt": PROMPT, "max_tokens": 24, "temperature": 0, "speculation": {"mode": mode}}
    whole, streamed = asyncio.run(_ask([base, {**base, "stream": True, "stream_options": {"include_usage": True}}]))
    assert whole.status_code == streamed.status_code == 200
    for reported in (whole.json()["usage"], _streamed_usage(streamed.text)):
        assert reported["completion_tokens"] == 24
        if mode == "off":
            assert "speculation" not in reported
            continue
        spec = reported["speculation"]
        assert spec["draft_tokens"] >= spec["accepted_tokens"] > 0 and spec["drafted_rounds"] > 0
        assert spec["acceptance_length"] == round(
            (spec["accepted_tokens"] + spec["drafted_rounds"]) / spec["drafted_rounds"], 4
        )
