"""The Triton contract end to end: the real gateway (OpenAI HTTP API, worker pool, dispatcher, worker client) in front
of an in-process Triton (tests/kserve_triton.py) that loads the config.pbtxt `python -m export --format triton-repo`
writes, refuses what Triton refuses, and runs the exported model.py over a scripted TensorRT-LLM.

Triton's rules come from triton-inference-server/server src/grpc/infer_handler.cc (ModelInferHandler::Execute:
"ModelInfer RPC doesn't support models with decoupled transaction policy") and triton-inference-server/core
src/infer_request.cc (InferenceRequest::Normalize: undeclared inputs, shapes against dims and max_batch_size); the
model's inputs and outputs are the stock LLM-API model's (NVIDIA/TensorRT-LLM
triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt and 1/helpers.py get_sampling_params_from_request)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from typing import cast

import grpc
import pytest
from tritonclient.grpc import service_pb2_grpc

from deepspec_protocol import triton_contract as c
from service.gateway.signature import ModelSignature
from service.gateway.worker_client import GenerationRequest, WorkerClient, WorkerError
from tests.export.conftest import run_export, write_hf_target
from tests.export.scored_llm import score
from tests.kserve_triton import (
    ACCEPTED_PER_STEP,
    DRAFTED_PER_STEP,
    WORDS,
    KServeTriton,
    ScriptedLLM,
    fakes_installed,
    parse_config,
)
from tests.service.conftest import in_process_gateway

MODEL = "tensorrt_llm"


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("triton-contract")
    out = root / "repo"
    result = run_export("--target", write_hf_target(root / "target", "llama"), "--format", "triton-repo", "--out", out)
    assert result.returncode == 0, result.stderr
    return out


@contextlib.asynccontextmanager
async def triton_and_gateway(repo):
    with fakes_installed():
        triton = KServeTriton(repo)
        port = await triton.start()
        try:
            async with in_process_gateway(f"127.0.0.1:{port}", "the Triton worker", client_timeout_s=20) as (
                client,
                state,
            ):
                yield client, triton, state
        finally:
            await triton.stop()


def _run(repo, scenario):
    async def main():
        async with triton_and_gateway(repo) as (client, triton, state):
            return await scenario(client, triton, state)

    return asyncio.run(main())


def _counter(state, name: str) -> float:
    return sum(
        s.value
        for m in state.metrics.registry.collect()
        if m.name == name
        for s in m.samples
        if s.name.endswith("_total")
    )


def test_non_streaming_completion_reaches_the_decoupled_model_with_usage_and_acceptance(repo):
    async def scenario(client, triton, state):
        response = await client.post("/v1/completions", json={"model": MODEL, "prompt": "hello", "max_tokens": 3})
        return (
            response,
            triton.requests,
            _counter(state, "deepspec:spec_decode_num_draft_tokens"),
            _counter(state, "deepspec:spec_decode_num_accepted_tokens"),
        )

    response, requests, drafted, accepted = _run(repo, scenario)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["choices"][0]["text"] == "".join(WORDS[:3]) and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {
        "prompt_tokens": len("hello"),
        "completion_tokens": 3,
        "total_tokens": len("hello") + 3,
        "speculation": {"draft_tokens": drafted, "accepted_tokens": accepted},
    }  # no rounds
    assert (drafted, accepted) == (3 * DRAFTED_PER_STEP, 3 * ACCEPTED_PER_STEP)
    (request,) = requests
    assert request._inputs[c.LLMAPI_NAMES["stream"]].tolist() == [False]


def test_streaming_completion_sends_every_step_once(repo):
    async def scenario(client, triton, state):
        payload = {
            "model": MODEL,
            "prompt": "hello",
            "max_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with client.stream("POST", "/v1/completions", json=payload) as response:
            lines = [line async for line in response.aiter_lines() if line.startswith("data: ")]
        return response.status_code, lines

    status, lines = _run(repo, scenario)
    assert status == 200
    events = [json.loads(line.removeprefix("data: ")) for line in lines if line != "data: [DONE]"]
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == "".join(WORDS[:4])
    assert events[-1]["usage"]["completion_tokens"] == 4 and events[-1]["usage"]["prompt_tokens"] == len("hello")


def test_chat_messages_travel_as_messages_json_and_the_model_renders_them(repo):
    async def scenario(client, triton, state):
        response = await client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stop": ["zz"]},
        )
        return response, triton.requests

    response, requests = _run(repo, scenario)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "".join(WORDS[:2])
    (request,) = requests
    assert json.loads(request._inputs["messages_json"][0]) == [{"role": "user", "content": "hi"}]
    assert request._inputs["sampling_param_stop"].tolist() == [b"zz"]


def test_a_client_that_disconnects_cancels_the_request_in_the_model(repo):
    async def scenario(client, triton, state):
        worker = WorkerClient(f"127.0.0.1:{triton.port}")
        stream = worker.generate(GenerationRequest("r-cancel", MODEL, prompt="slow", max_tokens=None), 10)
        await anext(stream)
        await stream.aclose()  # what a disconnecting client does to the gateway's call
        (request,) = triton.requests
        model, deadline = triton.models[MODEL], time.monotonic() + 5
        while not request.is_cancelled() or model.running:  # Triton flags it; the model's watcher aborts it
            assert time.monotonic() < deadline, "the model never aborted the cancelled request"
            await asyncio.sleep(0.01)
        await worker.close()
        return ScriptedLLM.instances[0].calls

    (call,) = _run(repo, scenario)
    assert call[0] == "slow" and call[2]  # streamed, then aborted (the scripted LLM would run forever)


def test_the_fake_triton_refuses_what_triton_refuses(repo):
    """Negative controls: the rules the gateway is tested against do bite."""
    from service.gateway.signature import DEEPSPEC_WORKER
    from service.kserve_messages import service_pb2

    async def scenario(client, triton, state):
        worker = WorkerClient(f"127.0.0.1:{triton.port}")
        req = GenerationRequest("r1", MODEL, prompt="hello", max_tokens=2)
        errors = []
        try:  # the old non-streaming call: unary ModelInfer
            await worker.stub.ModelInfer(_as_worker(req, stream=False))
        except grpc.aio.AioRpcError as e:
            errors.append(e.details())
        for inputs in (
            [("text_input", [1]), ("stream", [1])],  # the ensemble's name for streaming
            [("text_input", [1, 1])],
        ):  # the old [1, 1] shape on a model with max_batch_size 0
            request = service_pb2.ModelInferRequest(model_name=MODEL, id="r2")
            for name, shape in inputs:
                request.inputs.add(name=name, datatype="BYTES" if name == "text_input" else "BOOL", shape=shape)
                request.raw_input_contents.append(b"\x01\x00\x00\x00a" if name == "text_input" else b"\x01")
            async for response in worker.stub.ModelStreamInfer(iter([request])):
                errors.append(response.error_message)
        await worker.close()
        return errors

    def _as_worker(req, stream):
        from service.gateway.signature import build_request

        return build_request(req, stream, DEEPSPEC_WORKER)

    unary, unknown, shape = _run(repo, scenario)
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in unary
    assert "unexpected inference input 'stream'" in unknown
    assert "unexpected shape for input 'text_input' for model 'tensorrt_llm'. Expected [-1], got [1, 1]" in shape


def test_a_request_the_model_cannot_take_is_refused_by_the_gateway_with_the_input_named(repo):
    config = parse_config(repo / MODEL / "config.pbtxt")
    stock = ModelSignature.from_config(config)
    del config.input[[i.name for i in config.input].index("messages_json")]

    async def scenario(client, triton, state):
        worker = WorkerClient("127.0.0.1:1")
        worker.signatures[MODEL] = ModelSignature.from_config(config)  # a stock LLM-API model: no messages_json
        with pytest.raises(WorkerError, match="messages_json") as refused:
            await anext(worker.infer(GenerationRequest("r", MODEL, messages=[{"role": "user", "content": "x"}]), 5))
        await worker.close()
        return refused.value.status

    assert stock.decoupled and not stock.unary and stock.max_batch_size == 0
    ours = type(config)()
    ours.CopyFrom(config)
    ours.platform = "deepspec"  # DeepSpec's worker says decoupled too, and answers ModelInfer as well
    assert ModelSignature.from_config(ours).unary
    assert asyncio.run(scenario(None, None, None)) == "INVALID_ARGUMENT"


def test_the_stock_llmapi_models_cumulative_text_reaches_clients_as_deltas(repo):
    """The stock LLM-API model streams each response's whole text so far (NVIDIA/TensorRT-LLM
    triton_backend/all_models/llmapi/tensorrt_llm/1/model.py `_create_response` reads `CompletionOutput.text`,
    which tensorrt_llm/executor/result.py keeps cumulative; `text_diff` is the delta). The exported model says it
    sends deltas (config parameter TEXT_OUTPUT_MODE); a model without it has its text turned into deltas."""
    from deepspec_protocol import tensors
    from deepspec_protocol import worker as p
    from service.kserve_messages import service_pb2

    ours = parse_config(repo / MODEL / "config.pbtxt")
    stock = type(ours)()
    stock.CopyFrom(ours)
    del stock.parameters[c.TEXT_OUTPUT_MODE]
    assert not ModelSignature.from_config(ours).cumulative_text
    assert ModelSignature.from_config(stock).cumulative_text

    def response(text: str, final: bool):
        out = service_pb2.ModelInferResponse(model_name=MODEL, id="r")
        tensors.add_output(out, c.TEXT_OUTPUT, text)
        tensors.set_bool_param(out, p.FINAL_RESPONSE_PARAM, final)
        return service_pb2.ModelStreamInferResponse(infer_response=out)

    class StockCall:
        """A streaming call of the stock model: four cumulative responses."""

        def __init__(self):
            self.responses = iter(
                response(whole, final=i == 3) for i, whole in enumerate(["He", "Hello", "Hello wor", "Hello world"])
            )

        def __aiter__(self):
            return self

        async def __anext__(self):
            try:
                return next(self.responses)
            except StopIteration:
                raise StopAsyncIteration from None

        def cancel(self):
            pass

    class StockStub:
        def ModelStreamInfer(self, requests, timeout=None):
            return StockCall()

    async def texts(signature, stream: bool):
        worker = WorkerClient("127.0.0.1:1")
        # a stock Triton's stub: only the stream call the client makes
        worker.stub = cast(service_pb2_grpc.GRPCInferenceServiceStub, StockStub())
        worker.signatures[MODEL] = signature
        req = GenerationRequest("r", MODEL, prompt="x", max_tokens=4)
        chunks = [chunk.text async for chunk in (worker.generate(req, 5) if stream else worker.infer(req, 5))]
        await worker.close()
        return chunks

    stock_signature = ModelSignature.from_config(stock)
    assert asyncio.run(texts(stock_signature, True)) == ["He", "llo", " wor", "ld"]
    assert asyncio.run(texts(stock_signature, False)) == ["Hello world"]


def test_prompt_logprobs_token_prompts_and_structured_outputs_on_the_llmapi_model_are_a_400_naming_them(repo):
    """The LLM-API model declares none of DeepSpec's prompt-logprobs, `input_ids` or `structured_output` inputs: the
    gateway refuses before sending (a model would drop an undeclared feature or Triton refuse the input), with a
    400 that says so, and the model keeps serving."""
    cases = [
        (
            "/v1/completions",
            {"prompt": "hello", "echo": True, "max_tokens": 0},
            "prompt logprobs (echo) are not supported by this worker",
        ),
        (
            "/v1/completions",
            {"prompt": "hello", "echo": True, "logprobs": 1},
            "prompt logprobs (echo) are not supported by this worker",
        ),
        ("/v1/completions", {"prompt": [1, 2, 3]}, "token-id prompts are not supported by this worker"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}},
            "structured outputs are not supported by this worker",
        ),
        (
            "/v1/completions",
            {"prompt": "hello", "guided_regex": "[0-9]+"},
            "structured outputs are not supported by this worker",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "logprobs_mode": "processed_logprobs"},
            "processed logprobs (logprobs_mode) are not supported by this worker",
        ),
    ]

    async def scenario(client, triton, state):
        answers = [await client.post(path, json={"model": MODEL, "max_tokens": 2, **body}) for path, body, _ in cases]
        plain = await client.post("/v1/completions", json={"model": MODEL, "prompt": "hello", "max_tokens": 2})
        return answers, plain, len(triton.requests)

    answers, plain, sent = _run(repo, scenario)
    for response, (_, _, message) in zip(answers, cases):
        assert response.status_code == 400 and message in response.json()["error"]["message"], response.text
    assert plain.status_code == 200 and sent == 1  # only the plain request reached the model


def test_processed_logprobs_need_a_model_that_declares_logprobs_mode():
    """The mode goes only where it changes something (processed, with generated tokens scored) and only to a model
    that declares the input: one that scores tokens but has no `logprobs_mode` (a DeepSpec worker from before it)
    would answer raw numbers for processed ones, so the request is refused naming the input; the default is not
    sent, so such a model still serves it."""
    from service.gateway.signature import DEEPSPEC_WORKER, SignatureError, build_request

    def sent(request) -> dict:
        return {i.name: raw for i, raw in zip(request.inputs, request.raw_input_contents)}

    older = ModelSignature({n: s for n, s in DEEPSPEC_WORKER.inputs.items() if n != "logprobs_mode"}, 0, True, True)
    req = GenerationRequest("r", MODEL, prompt="x", logprobs=1, logprobs_mode="processed_logprobs")
    with pytest.raises(SignatureError, match=r"processed logprobs \(logprobs_mode\) are not supported by this worker"):
        build_request(req, True, older)
    for unsent in (dataclasses.replace(req, logprobs_mode="raw_logprobs"), dataclasses.replace(req, logprobs=None)):
        assert "logprobs_mode" not in sent(build_request(unsent, True, older))
    assert sent(build_request(req, True, DEEPSPEC_WORKER))["logprobs_mode"][4:] == b"processed_logprobs"


def test_the_score_outputs_are_the_workers():
    """The exported LLM-API model answers logprobs in the tensors DeepSpec's worker sends (deepspec_protocol/worker.py
    OUTPUT_SCORES), mirrored in the contract (which imports nothing), so the gateway reads both with one reader."""
    from deepspec_protocol.worker import OUTPUT_SCORES

    assert tuple(spec.name for spec in c.SCORE_OUTPUTS) == OUTPUT_SCORES.names()
    assert set(c.SCORE_OUTPUTS) <= set(c.LLMAPI_OUTPUTS)


def test_logprobs_from_the_exported_llmapi_model_reach_clients_in_openais_shapes(repo):
    """TensorRT-LLM's logprobs (tensorrt_llm/executor/result.py CompletionOutput.logprobs: per generated token a dict
    token id -> Logprob(logprob, rank), the top `SamplingParams.logprobs` and the sampled token; tests/export/
    scored_llm.py), sent by the exported model.py as the worker's score tensors, become chat's
    `logprobs.content` (streamed per chunk, whole) and completions' legacy shape, as for DeepSpec's worker."""
    from tests.export.scored_llm import distribution, text_of

    chat = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "logprobs": True,
        "top_logprobs": 1,
    }

    async def scenario(client, triton, state):
        score(triton.models[MODEL].llm)
        whole = await client.post("/v1/chat/completions", json=chat)
        async with client.stream("POST", "/v1/chat/completions", json={**chat, "stream": True}) as response:
            events = [json.loads(line[6:]) async for line in response.aiter_lines() if line.startswith("data: {")]
        completion = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": "hello", "max_tokens": 2, "logprobs": 2}
        )
        return whole, events, completion, triton.requests

    whole, events, completion, requests = _run(repo, scenario)
    assert whole.status_code == 200, whole.text
    content = whole.json()["choices"][0]["logprobs"]["content"]
    assert [t["token"] for t in content] == list(WORDS[:3])
    assert [t["logprob"] for t in content] == pytest.approx([distribution(i)[1][1] for i in range(3)])
    assert [[(a["token"], a["logprob"]) for a in t["top_logprobs"]] for t in content] == [
        [(text_of(200 + i), pytest.approx(-0.05))] for i in range(3)
    ]
    streamed = [t for e in events for ch in e["choices"] if ch["logprobs"] for t in ch["logprobs"]["content"]]
    assert streamed == content
    assert completion.status_code == 200, completion.text
    legacy = completion.json()["choices"][0]["logprobs"]
    assert legacy["tokens"] == list(WORDS[:2]) and legacy["text_offset"] == [0, len(WORDS[0])]
    assert legacy["top_logprobs"][1] == {text_of(201): pytest.approx(-0.05), WORDS[1]: pytest.approx(-0.2)}
    assert requests[0]._inputs["top_logprobs"].tolist() == [1] and requests[0]._inputs["return_log_probs"].tolist()


def test_a_stock_llmapi_model_refuses_logprobs_by_name(repo):
    """Upstream's LLM-API model reads no logprobs input (NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/
    tensorrt_llm/1/helpers.py get_sampling_params_from_request): a model without `return_log_probs` gets no
    logprobs request, the client a 400 that says so."""
    config = parse_config(repo / MODEL / "config.pbtxt")
    for name in ("return_log_probs", "top_logprobs"):
        del config.input[[i.name for i in config.input].index(name)]

    async def scenario():
        worker = WorkerClient("127.0.0.1:1")
        worker.signatures[MODEL] = ModelSignature.from_config(config)
        with pytest.raises(WorkerError, match="logprobs are not supported by this worker") as refused:
            await anext(worker.infer(GenerationRequest("r", MODEL, prompt="x", logprobs=1), 5))
        await worker.close()
        return refused.value.status

    assert asyncio.run(scenario()) == "INVALID_ARGUMENT"
