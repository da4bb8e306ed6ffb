"""Per-request speculation control (`speculation`): validated at the boundary, carried to the worker as
`max_draft_tokens`, honoured there (mode off drafts nothing; greedy output is the same in every mode), and passed to
an OpenAI-HTTP upstream only where it has a per-request field for it (llama.cpp), refused elsewhere."""

from __future__ import annotations

import grpc
import httpx
import openai
import pytest
from pydantic import ValidationError

from deepspec_protocol.protos.deepspec.v1 import completions_pb2 as pb
from deepspec_protocol.protos.deepspec.v1 import completions_pb2_grpc as pb_grpc
from service.gateway.errors import validation_message
from service.gateway.openai_client import request_body
from service.gateway.schemas import ChatCompletionRequest, CompletionRequest
from service.gateway.signature import DEEPSPEC_WORKER, build_request
from service.gateway.worker_client import GenerationRequest, WorkerError
from tests.service.conftest import metric_value

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("speculation", "cap"),
    [
        (None, None),
        ({}, None),
        ({"mode": "auto"}, None),
        ({"mode": "off"}, 0),
        ({"mode": "off", "max_draft_tokens": 0}, 0),
        ({"mode": "auto", "max_draft_tokens": 3}, 3),
        ({"max_draft_tokens": 0}, 0),
    ],
)
def test_the_field_becomes_the_workers_draft_cap(speculation, cap):
    body = CHAT if speculation is None else CHAT | {"speculation": speculation}
    assert ChatCompletionRequest.model_validate(body).generation()["max_draft_tokens"] == cap
    completion = CompletionRequest.model_validate(
        {"prompt": "hi", **({} if speculation is None else {"speculation": speculation})}
    )
    assert completion.generation("hi")["max_draft_tokens"] == cap


@pytest.mark.parametrize(
    ("speculation", "words"),
    [
        ({"mode": "fast"}, "'auto' or 'off'"),
        ({"max_draft_tokens": -1}, "greater than or equal to 0"),
        ({"max_draft_tokens": 65}, "less than or equal to 64"),
        ({"max_draft_tokens": "3"}, "valid integer"),
        ({"mode": "off", "max_draft_tokens": 4}, "drafts nothing"),
        ({"depth": 3}, "unrecognized request argument"),
    ],
)
def test_bad_values_are_400s_naming_the_field(speculation, words):
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate(CHAT | {"speculation": speculation})
    message, param = validation_message(info.value.errors())
    assert param is not None and param.startswith("speculation") and words in message, (param, message)


def test_the_worker_request_carries_the_cap_only_when_set():
    def inputs(**fields):
        request = build_request(GenerationRequest("r", "m", prompt="p", **fields), True, DEEPSPEC_WORKER)
        return {i.name for i in request.inputs}

    assert "max_draft_tokens" not in inputs()
    assert "max_draft_tokens" in inputs(max_draft_tokens=0)


def test_openai_upstreams_get_the_cap_where_they_can_take_it():
    req = GenerationRequest("r", "m", prompt="p", max_draft_tokens=2)
    assert request_body(req, True, llamacpp=True)["speculative.n_max"] == 2  # llama.cpp: per-request field
    for vllm in (True, False):  # vLLM, SGLang, trtllm-serve: per-server depth only -> refused, not dropped
        with pytest.raises(WorkerError) as info:
            request_body(req, True, vllm_extras=vllm)
        assert info.value.status == "INVALID_ARGUMENT" and "speculation" in info.value.message
    plain = request_body(GenerationRequest("r", "m", prompt="p"), True)
    assert not any(key.startswith("speculative") for key in plain)


# -- through real processes: gateway + stub worker with a draft --------------------------------------------------


def _draft_tokens(stub_worker) -> float:
    return metric_value(stub_worker.metrics(), "deepspec:spec_decode_num_draft_tokens_total")


def test_greedy_output_is_the_same_in_every_mode_and_off_drafts_nothing(gateway, stub_worker):
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0)
    texts, usages = {}, {}
    channel = grpc.insecure_channel(f"127.0.0.1:{gateway.grpc_port}")
    stub = pb_grpc.CompletionsStub(channel)
    for name, speculation in {
        "auto": None,
        "off": {"mode": "off"},
        "cap1": {"max_draft_tokens": 1},
        "cap0": {"mode": "auto", "max_draft_tokens": 0},
    }.items():
        before = _draft_tokens(stub_worker)
        extra = {} if speculation is None else {"speculation": speculation}
        chat = client.chat.completions.create(
            model="stub",
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=24,
            temperature=0,
            extra_body=extra,
        )
        streamed = "".join(
            c.choices[0].text
            for c in client.completions.create(
                model="stub", prompt="Hello", max_tokens=24, temperature=0, stream=True, extra_body=extra
            )
            if c.choices
        )
        drafted = _draft_tokens(stub_worker) - before
        message = pb.CompletionRequest(prompt="Hello", max_tokens=24, temperature=0)
        if speculation is not None:
            message.speculation.CopyFrom(pb.Speculation(**speculation))
        usage = stub.Complete(message, timeout=30).usage
        texts[name], usages[name] = (chat.choices[0].message.content, streamed), (drafted, usage)
    channel.close()
    assert len(set(texts.values())) == 1 and texts["auto"][0]  # greedy: same text in every mode
    assert usages["auto"][0] > 0 and usages["auto"][1].num_draft_tokens > 0  # the stub worker drafts by default
    for off in ("off", "cap0"):
        assert usages[off][0] == 0 and usages[off][1].num_draft_tokens == 0  # worker metrics and usage agree
    cap = usages["cap1"][1]
    assert cap.num_draft_tokens > 0 and cap.num_draft_tokens <= cap.completion_tokens  # at most 1 per round


def test_a_bad_speculation_field_is_a_400_from_the_gateway(gateway):
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=CHAT | {"speculation": {"mode": "off", "max_draft_tokens": 3}}
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"].startswith("speculation")
    channel = grpc.insecure_channel(f"127.0.0.1:{gateway.grpc_port}")
    with pytest.raises(grpc.RpcError) as info:
        pb_grpc.CompletionsStub(channel).Complete(
            pb.CompletionRequest(prompt="Hi", speculation=pb.Speculation(mode="never")), timeout=30
        )
    channel.close()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "speculation" in (info.value.details() or "")
