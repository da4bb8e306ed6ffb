"""The `openai` package and raw HTTP against a real gateway in front of a real stub worker."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from deepspec_protocol.worker import MAX_CHARS_PER_TOKEN
from service.worker.stub_target import STUB_TEXT
from tests.service.conftest import Gateway, metric_value

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(gateway):
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)


def chat_prompt_tokens(messages) -> int:
    """The stub's chat template, `<|role|>content\\n` per message + `<|assistant|>`, one token per byte."""
    return len(("".join(f"<|{m['role']}|>{m['content']}\n" for m in messages) + "<|assistant|>").encode())


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == ["stub"]


def test_completion_whole(client):
    result = client.completions.create(model="stub", prompt="Hello", max_tokens=20, temperature=0)
    assert result.choices[0].text == STUB_TEXT[:20]
    assert result.choices[0].finish_reason == "length"
    assert (result.usage.prompt_tokens, result.usage.completion_tokens, result.usage.total_tokens) == (5, 20, 25)


def test_completion_stream_with_usage(client):
    stream = client.completions.create(
        model="stub", prompt="Hello", max_tokens=33, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == STUB_TEXT[:33]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 33
    assert chunks[-1].usage.prompt_tokens == 5


def test_chat_whole_counts_the_chat_template(client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    result = client.chat.completions.create(model="stub", messages=messages, max_tokens=12)
    assert result.choices[0].message.role == "assistant"
    assert result.choices[0].message.content == STUB_TEXT[:12]
    assert result.usage.prompt_tokens == chat_prompt_tokens(messages)
    assert result.usage.completion_tokens == 12


def test_chat_stream(client):
    messages = [{"role": "user", "content": "Hi"}]
    chunks = list(
        client.chat.completions.create(
            model="stub", messages=messages, max_tokens=25, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == STUB_TEXT[:25]
    assert chunks[-1].usage.prompt_tokens == chat_prompt_tokens(messages)
    assert chunks[-1].usage.completion_tokens == 25


def test_stop_string(client):
    result = client.completions.create(model="stub", prompt="x", max_tokens=40, stop=["brown"])
    assert result.choices[0].text == "The quick " and result.choices[0].finish_reason == "stop"


def test_raw_sse_ends_with_done(gateway):
    with httpx.stream(
        "POST", f"{gateway.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 5, "stream": True}
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: ") for line in lines)
    json.loads(lines[0].removeprefix("data: "))


BAD_REQUESTS = [
    ("malformed JSON", b'{"prompt": "x", ', 400, "not valid JSON"),
    ("not an object", b"[1, 2]", 400, "valid dictionary"),
    ("wrong type", json.dumps({"prompt": "x", "max_tokens": "5"}).encode(), 400, "max_tokens"),
    ("negative max_tokens", json.dumps({"prompt": "x", "max_tokens": -3}).encode(), 400, "max_tokens"),
    ("huge max_tokens", json.dumps({"prompt": "x", "max_tokens": 10**12}).encode(), 400, "max_tokens"),
    ("beyond context", json.dumps({"prompt": "x" * 2000, "max_tokens": 100}).encode(), 400, "context length"),
    ("n past 128", json.dumps({"prompt": "x", "n": 129}).encode(), 400, "n: Input should be less than or equal to 128"),
    ("unknown model", json.dumps({"prompt": "x", "model": "gpt-9"}).encode(), 404, "does not exist"),
    ("10 MB body", json.dumps({"prompt": "x" * 10_000_000}).encode(), 413, "exceeds"),
    ("invalid UTF-8", b'{"prompt": "\xff\xfe", "max_tokens": 3}', 400, "UTF-8"),
    ("missing prompt", b'{"max_tokens": 3}', 400, "prompt"),
    ("lone surrogate in the prompt", b'{"prompt": "hi\\ud800", "max_tokens": 2}', 400, "lone surrogate"),
    ("lone surrogate in a stop string", b'{"prompt": "hi", "stop": ["a\\udfff"]}', 400, "stop"),
    ("NaN temperature", b'{"prompt": "x", "temperature": NaN}', 400, "finite number"),
    ("infinite top_p", b'{"prompt": "x", "top_p": Infinity}', 400, "finite number"),
    ("17 stop strings", json.dumps({"prompt": "x", "stop": ["a"] * 17}).encode(), 400, "at most 16 items"),
    ("3 MB stop string", json.dumps({"prompt": "x", "stop": ["s" * 3_000_000]}).encode(), 400, "at most 1024"),
    # the stub's context is 2,048 tokens: at most 2,048 x 128 characters, refused before any worker tokenizes it
    ("3.9 MB prompt", json.dumps({"prompt": "x" * 3_900_000, "max_tokens": 2}).encode(), 400, "3900000 characters"),
    # nothing is silently ignored: an unknown field, or a known one away from its neutral value, is a 400 naming it
    ("unknown field", json.dumps({"prompt": "x", "min_tokens": 4}).encode(), 400, "min_tokens: unrecognized"),
    (
        "two output constraints",
        json.dumps({"prompt": "x", "response_format": {"type": "json_object"}, "guided_regex": "a"}).encode(),
        400,
        "one output constraint",
    ),
    ("logit_bias", json.dumps({"prompt": "x", "logit_bias": {"42": 5}}).encode(), 400, "logit_bias is not supported"),
]

#: chat requests the server cannot honour: tool calls, a schema-less JSON schema, logprobs, unknown fields (also
#: inside a message)
BAD_CHAT_REQUESTS = [
    ("tools", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools: tool calls"),
    ("tool_choice", {"tool_choice": "required"}, "tool_choice"),
    (
        "json_schema without its schema",
        {"response_format": {"type": "json_schema", "json_schema": {"name": "a"}}},
        "response_format.json_schema.schema: Field required",
    ),
    ("top_logprobs without logprobs", {"top_logprobs": 3}, "top_logprobs needs logprobs: true"),
    ("unknown field", {"guided_decoding_backend": "xgrammar"}, "guided_decoding_backend: unrecognized request"),
    (
        "unknown message field",
        {"messages": [{"role": "user", "content": "hi", "tool_calls": []}]},
        "messages.0.tool_calls: unrecognized",
    ),
]


@pytest.mark.parametrize(("body", "status", "message"), [b[1:] for b in BAD_REQUESTS], ids=[b[0] for b in BAD_REQUESTS])
def test_bad_input_gets_a_clear_4xx_and_the_next_request_works(gateway, client, body, status, message):
    response = httpx.post(f"{gateway.url}/v1/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert message in error["message"], error
    assert client.completions.create(model="stub", prompt="ok", max_tokens=3).choices[0].text == "The"


@pytest.mark.parametrize(
    ("extra", "message"), [b[1:] for b in BAD_CHAT_REQUESTS], ids=[b[0] for b in BAD_CHAT_REQUESTS]
)
def test_chat_fields_the_server_cannot_honour_are_a_400_naming_them(gateway, extra, message):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **extra}
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]["message"], response.json()


def test_neutral_values_of_unimplemented_fields_are_accepted(client):
    """What clients send by default (no tools, text output, no logprobs) must not be refused."""
    reply = client.chat.completions.create(
        model="stub",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=2,
        response_format={"type": "text"},
        tools=[],
        tool_choice="none",
        logprobs=False,
        top_logprobs=0,
        logit_bias={},
        n=1,
    )
    assert reply.choices[0].message.content


def test_a_lone_surrogate_in_a_chat_message_is_a_400(gateway):
    body = b'{"messages": [{"role": "user", "content": "hi \\ud83d"}], "max_tokens": 2}'
    response = httpx.post(f"{gateway.url}/v1/chat/completions", content=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "messages.0.content"
    assert "lone surrogate" in response.json()["error"]["message"]


def test_an_oversized_prompt_is_refused_by_its_length_before_any_tokenizing(gateway):
    """One character over context x MAX_CHARS_PER_TOKEN is the gateway's 400, counted in characters (the worker would
    count tokens); messages count together. One character under goes on to the worker, which counts tokens."""
    limit = 2048 * MAX_CHARS_PER_TOKEN
    for path, body in [
        ("/v1/completions", {"prompt": "x" * (limit + 1)}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "y" * (limit // 2)}] * 3}),
    ]:
        response = httpx.post(f"{gateway.url}{path}", json={**body, "max_tokens": 1})
        assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
        assert "characters" in response.json()["error"]["message"]
    response = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "x" * limit, "max_tokens": 1})
    assert response.status_code == 400 and "characters" not in response.json()["error"]["message"], response.text


def test_openai_client_raises_typed_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")
    with pytest.raises(openai.BadRequestError, match="context length"):
        client.chat.completions.create(model="stub", messages=[{"role": "user", "content": "x" * 3000}], max_tokens=5)


def test_unknown_route_is_an_openai_404(gateway):
    response = httpx.get(f"{gateway.url}/v1/nothing")
    assert response.status_code == 404 and "error" in response.json()


def test_health_and_metrics(gateway, client):
    client.completions.create(model="stub", prompt="Hello", max_tokens=10)
    assert httpx.get(f"{gateway.url}/health/live").status_code == 200
    assert httpx.get(f"{gateway.url}/health/ready").json()["status"] == "ready"
    text = httpx.get(f"{gateway.url}/metrics").text
    assert metric_value(text, "deepspec:time_to_first_token_seconds_count", model="stub") > 0
    assert metric_value(text, "deepspec:request_success_total", status="length") > 0
    assert metric_value(text, "deepspec:generation_tokens_total") > 0
    assert metric_value(text, "deepspec:gateway_worker_healthy") == 1
    assert 'worker="127.0.0.1:' in text


def test_api_keys(stub_worker, tmp_path):
    keys_file = tmp_path / "keys"
    keys_file.write_text("# ops key\nfile-key\n")
    gw = (
        Gateway(tmp_path, stub_worker.address, "--api-keys-file", str(keys_file), env={"DEEPSPEC_API_KEYS": "env-key"})
        .start()
        .wait_ready()
    )
    try:
        for key in ("file-key", "env-key"):
            c = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0)
            assert c.completions.create(model="stub", prompt="x", max_tokens=2).choices[0].text == "Th"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{gw.url}/v1", api_key="wrong", max_retries=0).models.list()
        response = httpx.post(f"{gw.url}/v1/completions", content=b"{bad")
        assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{gw.url}/health/ready").status_code == 200  # probes and metrics stay open
        assert httpx.get(f"{gw.url}/metrics").status_code == 200
    finally:
        gw.terminate()
