"""Structured outputs end to end: the `openai` client (`chat.completions.parse` with a pydantic model, JSON modes,
vLLM's extras), raw SSE and the gRPC API against a real gateway in front of a real worker serving the default target
(SmolLM2-135M, greedy) with a prompt-lookup draft, so every constrained request also runs under speculation.

The request shapes are OpenAI's (`response_format` json_object / json_schema: platform.openai.com/docs/api-reference/
chat/create) and vLLM's: `structured_outputs` (vllm-project/vllm vllm/entrypoints/openai/chat_completion/protocol.py
and completion/protocol.py `structured_outputs: StructuredOutputsParams`, vllm/sampling_params.py
StructuredOutputsParams: json, regex, choice, grammar, json_object) and its older top-level `guided_json`,
`guided_regex`, `guided_choice`, `guided_grammar` (vllm/entrypoints/openai/protocol.py ChatCompletionRequest before
they moved into structured_outputs).
"""

from __future__ import annotations

import json
import re
from typing import Literal

import grpc
import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from deepspec_protocol.protos.deepspec.v1 import completions_pb2 as pb
from deepspec_protocol.protos.deepspec.v1 import completions_pb2_grpc as pb_grpc
from tests.service.conftest import served

pytestmark = pytest.mark.integration

MODEL = "smollm2-135m"
CAPITAL_QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in JSON."}]


class Capital(BaseModel):
    """Enums keep the greedy answer short: it must end after one of a few strings."""

    city: Literal["Paris", "London", "Berlin"]
    country: Literal["France", "UK", "Germany"]


CAPITAL_SCHEMA = Capital.model_json_schema()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with served(
        tmp_path_factory.mktemp("servers"), "--target", MODEL, "--draft", "prompt-lookup", "--max-seq-len", "512"
    ) as gw:
        yield gw


@pytest.fixture(scope="module")
def client(gateway):
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)


def post(gateway, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{gateway.url}{path}", json={"model": MODEL, "temperature": 0, **body}, timeout=120)


def test_parse_with_a_pydantic_model_returns_the_parsed_object(client):
    """The openai client's `chat.completions.parse` sends the model's strict JSON schema as response_format
    json_schema and parses the reply into the model: the constraint makes that parse succeed."""
    completion = client.chat.completions.parse(
        model=MODEL, messages=CAPITAL_QUESTION, response_format=Capital, temperature=0, max_tokens=40
    )
    message = completion.choices[0].message
    assert completion.choices[0].finish_reason == "stop"
    assert message.parsed == Capital(city="Paris", country="France"), message.content


def test_json_object_output_parses(client):
    reply = client.chat.completions.create(
        model=MODEL,
        temperature=0,
        max_tokens=60,
        response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "Describe a cat as a JSON object with a name and an age."}],
    )
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


@pytest.mark.parametrize(
    "extra",
    [{"structured_outputs": {"regex": "[0-9]{5}"}}, {"guided_regex": "[0-9]{5}"}],
    ids=["structured_outputs", "guided_regex"],
)
def test_regex_through_vllms_extras(client, extra):
    reply = client.chat.completions.create(
        model=MODEL,
        temperature=0,
        max_tokens=10,
        extra_body=extra,
        messages=[{"role": "user", "content": "Give a US ZIP code."}],
    )
    assert re.fullmatch("[0-9]{5}", reply.choices[0].message.content)
    assert reply.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    "extra",
    [{"structured_outputs": {"choice": ["yes", "no"]}}, {"guided_choice": ["yes", "no"]}],
    ids=["structured_outputs", "guided_choice"],
)
def test_choice_through_vllms_extras_on_completions(client, extra):
    reply = client.completions.create(
        model=MODEL, prompt="Is the sky blue? Answer yes or no:", temperature=0, max_tokens=5, extra_body=extra
    )
    assert reply.choices[0].text in ("yes", "no") and reply.choices[0].finish_reason == "stop"


def test_a_grammar_constrains_the_output(gateway):
    body = {"prompt": "Pick a colour:", "max_tokens": 8, "structured_outputs": {"grammar": 'root ::= "red" | "blue"'}}
    response = post(gateway, "/v1/completions", body)
    assert response.status_code == 200 and response.json()["choices"][0]["text"] in ("red", "blue"), response.text


def test_a_streamed_constrained_reply_concatenates_to_valid_output(gateway):
    """Streaming changes nothing: the chunks' text is the constrained text, which validates against its schema."""
    body = {
        "messages": CAPITAL_QUESTION,
        "max_tokens": 40,
        "stream": True,
        "response_format": {"type": "json_schema", "json_schema": {"name": "capital", "schema": CAPITAL_SCHEMA}},
    }
    with httpx.stream(
        "POST", f"{gateway.url}/v1/chat/completions", json={"model": MODEL, "temperature": 0, **body}, timeout=120
    ) as response:
        assert response.status_code == 200, response.read()
        lines = [line.removeprefix("data: ") for line in response.iter_lines() if line]
    assert lines[-1] == "[DONE]"
    choices = [json.loads(line)["choices"][0] for line in lines[:-1]]
    text = "".join(c["delta"].get("content") or "" for c in choices)
    assert len([c for c in choices if c["delta"].get("content")]) > 1  # really streamed
    jsonschema.validate(json.loads(text), CAPITAL_SCHEMA)
    assert choices[-1]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
            "Field required",
        ),
        ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "no spaces", "schema": {}}}},
            "response_format.json_schema.name",
            "pattern",
        ),
        (
            {"response_format": {"type": "json_object"}, "guided_regex": "a"},
            None,
            "one output constraint, got response_format and guided_regex",
        ),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "exactly one"),
        (
            {"structured_outputs": {"regex": "a", "whitespace_pattern": " "}},
            "structured_outputs.whitespace_pattern",
            "unrecognized request argument",
        ),
        ({"guided_choice": []}, "guided_choice", "at least 1"),
    ],
)
def test_malformed_constraints_are_a_400_naming_the_field(gateway, body, param, message):
    response = post(gateway, "/v1/chat/completions", {"messages": CAPITAL_QUESTION, **body})
    error = response.json()["error"]
    assert response.status_code == 400 and message in error["message"] and error["param"] == param, response.text


@pytest.mark.parametrize(
    "body",
    [
        {"structured_outputs": {"regex": "([0-9]"}},
        {"guided_grammar": "root ::= "},
        {"structured_outputs": {"json": "{not json"}},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}},
    ],
    ids=["regex", "grammar", "json-text", "schema"],
)
def test_a_spec_that_does_not_compile_is_the_engines_400_with_its_code(gateway, body):
    """The worker's engine compiles the constraint (xgrammar) and refuses what does not compile with the code
    structured_output_invalid, which reaches the OpenAI error body; the worker keeps serving."""
    response = post(gateway, "/v1/completions", {"prompt": "x", "max_tokens": 2, **body})
    assert response.status_code == 400 and response.json()["error"]["code"] == "structured_output_invalid", (
        response.text
    )
    assert post(gateway, "/v1/completions", {"prompt": "x", "max_tokens": 2}).status_code == 200


@pytest.fixture(scope="module")
def grpc_stub(gateway):
    with grpc.insecure_channel(f"127.0.0.1:{gateway.grpc_port}") as channel:
        yield pb_grpc.CompletionsStub(channel)


def test_grpc_structured_output_constrains_whole_and_streamed_replies(grpc_stub):
    schema = pb.StructuredOutput(kind="json_schema", spec=json.dumps(CAPITAL_SCHEMA))
    request = pb.CompletionRequest(
        messages=[pb.ChatMessage(**m) for m in CAPITAL_QUESTION], max_tokens=40, structured_output=schema
    )
    whole = grpc_stub.Complete(request)
    assert Capital.model_validate_json(whole.text) and whole.finish_reason == "stop"
    assert "".join(chunk.text for chunk in grpc_stub.CompleteStream(request)) == whole.text
    choice = grpc_stub.Complete(
        pb.CompletionRequest(
            prompt="Is the sky blue? Answer yes or no:",
            max_tokens=5,
            structured_output=pb.StructuredOutput(kind="choice", spec='["yes", "no"]'),
        )
    )
    assert choice.text in ("yes", "no")


@pytest.mark.parametrize(
    ("kind", "spec", "message"),
    [
        ("xml", "<a/>", "kind must be one of"),
        ("choice", "yes", "JSON list"),
        ("regex", "", "at least 1"),
        ("regex", "([0-9]", "invalid regex constraint"),
    ],
)
def test_grpc_refuses_bad_constraints_with_invalid_argument(grpc_stub, kind, spec, message):
    with pytest.raises(grpc.RpcError) as info:
        grpc_stub.Complete(
            pb.CompletionRequest(prompt="x", max_tokens=2, structured_output=pb.StructuredOutput(kind=kind, spec=spec))
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in (info.value.details() or "")


def test_a_constraint_no_output_can_match_is_the_engines_400(gateway):
    """A regex whose language is empty compiles, but no token is ever allowed: the request must be refused with the
    engine's code, not fail the batch it runs in. Last in the module: today it gets the worker ejected for a moment."""
    response = post(
        gateway, "/v1/completions", {"prompt": "x", "max_tokens": 2, "guided_regex": "[^\\x00-\\U0010FFFF]"}
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == "structured_output_invalid", (
        response.text
    )
