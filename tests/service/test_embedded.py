"""`python -m service` (the embedded default) with the real default target: the README's main command works."""

from __future__ import annotations

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.ports import free_port
from tests.service.conftest import ServerProcess, metric_value

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    server = ServerProcess(
        [
            "--host",
            "127.0.0.1",
            "--http-port",
            str(http_port),
            "--grpc-port",
            str(grpc_port),
            "--metrics-port",
            str(metrics_port),
        ],
        tmp_path_factory.mktemp("embedded") / "embedded.log",
    ).start()
    url = f"http://127.0.0.1:{http_port}"
    try:
        server.wait_until(lambda: httpx.get(f"{url}/health/ready", timeout=2).status_code == 200, 600)
        yield server, url, metrics_port
    finally:
        server.terminate()


def test_embedded_default_serves_the_default_target_with_a_draft(embedded):
    server, url, metrics_port = embedded
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["smollm2-135m"]
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "Write a Python function that returns the square of x."}
    ]
    whole = client.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=24, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model="smollm2-135m",
            messages=messages,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert whole.choices[0].message.content == streamed and streamed  # greedy: same text either way
    assert whole.usage is not None and chunks[-1].usage is not None
    assert whole.usage.prompt_tokens == chunks[-1].usage.prompt_tokens > 10  # chat template tokens included
    assert whole.usage.completion_tokens == chunks[-1].usage.completion_tokens <= 24
    log = server.log()
    assert "OpenAI API http://" in log and '"event": "request"' in log  # URLs logged; one JSON line per request
    assert "(quantization gguf)" in log  # the default runs the GGUF's own 4-bit weights (--quantization auto)
    worker_metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
    assert metric_value(worker_metrics, "deepspec:spec_decode_num_draft_tokens_total") > 0  # the draft is on


def test_embedded_rejects_prompts_beyond_the_context(embedded):
    _, url, _ = embedded
    # the default target declares 8,192 tokens of context (service/worker/context.py serves what it declares)
    response = httpx.post(f"{url}/v1/completions", json={"prompt": "hello " * 9000, "max_tokens": 4})
    assert response.status_code == 400 and "context length" in response.json()["error"]["message"]
    assert httpx.post(f"{url}/v1/completions", json={"prompt": "def f(x):", "max_tokens": 4}).status_code == 200


def test_embedded_greedy_output_is_the_same_with_speculation_on_capped_and_off(embedded):
    """The real target and its draft: the per-request `speculation` field changes how many tokens a round commits,
    never which; mode off drafts nothing (the worker's draft-token counter does not move)."""
    _, url, metrics_port = embedded
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "List the first five prime numbers, separated by commas."}
    ]

    def drafted() -> float:
        return metric_value(
            httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text, "deepspec:spec_decode_num_draft_tokens_total"
        )

    texts, draft_tokens = {}, {}
    for mode, speculation in {"auto": {}, "capped": {"max_draft_tokens": 2}, "off": {"mode": "off"}}.items():
        before = drafted()
        reply = client.chat.completions.create(
            model="smollm2-135m",
            messages=messages,
            max_tokens=32,
            temperature=0,
            extra_body={"speculation": speculation},
        )
        texts[mode], draft_tokens[mode] = reply.choices[0].message.content, drafted() - before
    assert texts["auto"] and texts["auto"] == texts["capped"] == texts["off"]
    assert draft_tokens["auto"] > 0 and draft_tokens["capped"] > 0 and draft_tokens["off"] == 0
