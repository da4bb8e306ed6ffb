"""`tritonclient.grpc` against a real worker process (the real engine over the stub target): infer, stream_infer,
metadata, errors and their codes, slots."""

from __future__ import annotations

import queue
import re
import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from deepspec_protocol import worker as p
from service.worker.stub_target import STUB_TEXT
from tests.service.conftest import Worker, metric_value, output

pytestmark = pytest.mark.integration


def inputs(prompt: str | bytes = "Hello", max_tokens: int = 20, stream: bool | None = None, **extra):
    def tensor(name, array, dtype):
        t = triton.InferInput(name, list(array.shape), dtype)
        t.set_data_from_numpy(array)
        return t

    raw = prompt if isinstance(prompt, bytes) else prompt.encode()
    out = [
        tensor("text_input", np.array([[raw]], dtype=object), "BYTES"),
        tensor("max_tokens", np.array([[max_tokens]], dtype=np.int32), "INT32"),
    ]
    if stream is not None:
        out.append(tensor("stream", np.array([[stream]], dtype=bool), "BOOL"))
    if "stop_words" in extra:
        out.append(tensor("stop_words", np.array([[s.encode() for s in extra["stop_words"]]], dtype=object), "BYTES"))
    if "temperature" in extra:
        out.append(tensor("temperature", np.array([[extra["temperature"]]], dtype=np.float32), "FP32"))
    if "seed" in extra:
        out.append(tensor("seed", np.array([[extra["seed"]]], dtype=np.uint64), "UINT64"))
    if "num_return_sequences" in extra:
        out.append(tensor("num_return_sequences", np.array([[extra["num_return_sequences"]]], dtype=np.int32), "INT32"))
    return out


def _trailers(error: grpc.RpcError) -> dict[str, str | bytes]:
    """The trailing metadata of a failed call, by key."""
    assert isinstance(error, grpc.Call), error  # what a failed grpc call raises
    return {item.key: item.value for item in error.trailing_metadata() or ()}


def stream_started(worker: Worker, max_tokens: int) -> tuple[triton.InferenceServerClient, queue.Queue]:
    """A client with one stream running on `worker`: its first response has arrived (so the request holds a slot)."""
    client = triton.InferenceServerClient(worker.address)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    client.async_stream_infer("stub", inputs("Hello", max_tokens=max_tokens, stream=True))
    responses.get(timeout=60)  # seconds on an idle machine; the budget only matters on cores shared with other jobs
    return client, responses


@pytest.fixture(scope="module")
def client(stub_worker):
    c = triton.InferenceServerClient(stub_worker.address)
    yield c
    c.close()


def test_metadata_and_config(client):
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("stub")
    meta = client.get_model_metadata("stub", as_json=True)
    names = {t["name"] for t in meta["inputs"]}
    assert {
        "text_input",
        "max_tokens",
        "stream",
        "temperature",
        "top_k",
        "top_p",
        "seed",
        "stop_words",
        "end_id",
    } <= names
    assert {"text_output", "num_draft_tokens", "num_accepted_tokens"} <= {t["name"] for t in meta["outputs"]}
    config = client.get_model_config("stub", as_json=True)["config"]
    assert config["model_transaction_policy"]["decoupled"] is True
    assert config["parameters"]["max_seq_len"]["string_value"] == "2048"


def test_infer_returns_text_and_exact_counts(client):
    result = client.infer("stub", inputs("Hello", max_tokens=20))
    assert result.as_numpy("text_output")[0][0].decode() == STUB_TEXT[:20]
    assert result.as_numpy("num_prompt_tokens")[0][0] == 5  # byte-level stub tokenizer
    assert result.as_numpy("num_output_tokens")[0][0] == 20
    assert result.as_numpy("finish_reason")[0][0] == b"length"
    assert result.as_numpy("num_accepted_tokens")[0][0] <= result.as_numpy("num_draft_tokens")[0][0]


def test_stop_words_cut_the_text(client):
    result = client.infer("stub", inputs("Hi", max_tokens=40, stop_words=["fox"]))
    assert result.as_numpy("text_output")[0][0].decode() == "The quick brown "
    assert result.as_numpy("finish_reason")[0][0] == b"stop"


def test_stream_infer_streams_deltas_and_flags_the_final_response(client):
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer("stub", inputs("Hello", max_tokens=30, stream=True), request_id="s1")
        texts = []
        while True:
            result, error = responses.get(timeout=10)
            assert error is None, error
            texts.append(result.as_numpy("text_output")[0][0].decode())
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
    assert len(texts) > 3  # several steps, each a chunk
    assert "".join(texts) == STUB_TEXT[:30]
    assert result.as_numpy("num_output_tokens")[0][0] == 30
    assert result.get_response().id == "s1"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (dict(prompt=""), "prompt is empty"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_tokens=5000), "maximum context length"),
        (dict(prompt=b"\xff\xfe"), "UTF-8"),
        (dict(temperature=-1.0), "temperature"),
    ],
)
def test_bad_input_is_invalid_argument(client, args, message):
    with pytest.raises(InferenceServerException) as info:
        client.infer("stub", inputs(**args))
    assert "INVALID_ARGUMENT" in str(info.value.status()) and message in info.value.message()
    assert client.infer("stub", inputs("ok", max_tokens=3)).as_numpy("text_output")[0][0] == b"The"


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (dict(prompt=""), "prompt_empty"),
        (dict(max_tokens=0), "max_tokens_invalid"),
        (dict(max_tokens=5000), "context_length_exceeded"),
        (dict(prompt="x" * 2048, max_tokens=1), "context_length_exceeded"),
        (dict(temperature=float("nan")), "sampling_invalid"),
    ],
)
def test_engine_refusals_carry_their_code_in_unary_metadata_and_in_streams(stub_worker, args, code):
    """The engine's RequestErrorCode reaches the client in the structured fields deepspec_protocol/worker.py names."""
    from tritonclient.grpc import service_pb2_grpc

    from service.kserve_messages import service_pb2

    assert code in p.ERROR_CODES
    request = service_pb2.ModelInferRequest(model_name="stub", id="e1")
    for t in inputs(**args):
        request.inputs.append(t._get_tensor())
        request.raw_input_contents.append(t._get_content())
    with grpc.insecure_channel(stub_worker.address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request, timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert _trailers(info.value)[p.ERROR_CODE_METADATA] == code
        (response,) = list(stub.ModelStreamInfer(iter([request]), timeout=10))
        assert response.error_message.startswith("INVALID_ARGUMENT: ")
        assert response.infer_response.parameters[p.ERROR_CODE_PARAM].string_param == code


def test_a_prompt_too_long_to_fit_is_refused_by_its_length_before_tokenizing(client):
    """A client calling the worker directly gets the gateway's character bound too: the refusal names characters,
    which only the pre-tokenizer check counts, and one character under the bound is tokenized (and refused by the
    engine in tokens)."""
    limit = p.max_prompt_chars(2048)
    with pytest.raises(InferenceServerException) as info:
        client.infer("stub", inputs("x" * (limit + 1), max_tokens=1))
    assert "INVALID_ARGUMENT" in str(info.value.status()) and f"{limit + 1} characters" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        client.infer("stub", inputs("x" * limit, max_tokens=1))
    assert "characters" not in info.value.message() and "tokens" in info.value.message()


def test_unreadable_input_is_invalid_argument_without_a_code(stub_worker):
    from tritonclient.grpc import service_pb2_grpc

    from service.kserve_messages import service_pb2

    request = service_pb2.ModelInferRequest(model_name="stub", id="e2")
    for t in inputs(prompt=b"\xff\xfe"):
        request.inputs.append(t._get_tensor())
        request.raw_input_contents.append(t._get_content())
    with grpc.insecure_channel(stub_worker.address) as channel, pytest.raises(grpc.RpcError) as info:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "UTF-8" in (info.value.details() or "")
    assert p.ERROR_CODE_METADATA not in _trailers(info.value)


def test_unknown_model_is_not_found(client):
    with pytest.raises(InferenceServerException) as info:
        client.infer("nope", inputs())
    assert "NOT_FOUND" in str(info.value.status())


def test_closed_stream_frees_the_slot(tmp_path):
    """A client that goes away mid-stream: the worker aborts the sequence and the running gauge drops to 0."""
    worker = Worker(tmp_path, "--stub-step-ms", "20", "--max-batch-size", "1").start().wait_ready()
    try:
        client, responses = stream_started(worker, 2000)
        assert metric_value(worker.metrics(), "deepspec:num_requests_running") == 1
        client.stop_stream(cancel_requests=True)
        deadline = time.monotonic() + 5
        while metric_value(worker.metrics(), "deepspec:num_requests_running") != 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        text = worker.metrics()
        assert metric_value(text, "deepspec:num_requests_running") == 0
        assert metric_value(text, "deepspec:request_success_total", status="abort") == 1
        # the single slot is free again: a new request completes at once
        assert output(client.infer("stub", inputs("x", max_tokens=2)), "num_output_tokens")[0][0] == 2
        client.close()
    finally:
        worker.terminate()


def test_full_queue_is_resource_exhausted(tmp_path):
    worker = Worker(tmp_path, "--stub-step-ms", "20", "--max-batch-size", "1", "--max-queue", "0").start().wait_ready()
    try:
        client, responses = stream_started(worker, 200)  # the one slot is taken
        with pytest.raises(InferenceServerException) as info:
            client.infer("stub", inputs("x", max_tokens=2))
        assert "RESOURCE_EXHAUSTED" in str(info.value.status())
        client.stop_stream(cancel_requests=True)
        client.close()
    finally:
        worker.terminate()


def test_worker_metrics_cover_every_worker_name(stub_worker, client):
    from service import metrics

    client.infer("stub", inputs("Hello", max_tokens=20))
    text = stub_worker.metrics()
    worker_names = set(metrics.ALL_METRIC_NAMES) - {n for n in metrics.ALL_METRIC_NAMES if ":gateway_" in n}
    for name in worker_names:
        assert name in text, name
    assert metric_value(text, "deepspec:spec_decode_num_accepted_tokens_per_pos_total", position="0") > 0


def test_the_inference_extensions_model_server_gauges_follow_the_batch(tmp_path):
    """An InferencePool's endpoint picker reads vLLM's three gauges (the model-server protocol): a running stream
    shows in them, and they fall back to 0 when it ends."""
    worker = Worker(tmp_path, "--stub-step-ms", "10", "--max-batch-size", "1").start().wait_ready()
    try:
        client, _ = stream_started(worker, 300)
        second = triton.InferenceServerClient(worker.address)
        second.start_stream(callback=lambda result, error: None)
        second.async_stream_infer("stub", inputs("Hi", max_tokens=300, stream=True))  # waits for the one slot
        deadline = time.monotonic() + 10
        while metric_value(worker.metrics(), "vllm:num_requests_waiting") < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        text = worker.metrics()
        assert metric_value(text, "vllm:num_requests_running", model_name="stub") == 1
        assert metric_value(text, "vllm:num_requests_waiting", model_name="stub") == 1
        assert 0 < metric_value(text, "vllm:kv_cache_usage_perc", model_name="stub") <= 1
        client.stop_stream(cancel_requests=True)
        second.stop_stream(cancel_requests=True)
        while metric_value(worker.metrics(), "vllm:num_requests_running") and time.monotonic() < deadline + 10:
            time.sleep(0.05)
        assert metric_value(worker.metrics(), "vllm:kv_cache_usage_perc") == 0
    finally:
        worker.terminate()


def test_sigterm_drains_the_worker(tmp_path):
    """SIGTERM: ServerReady turns false at once, the running stream still finishes, the process exits 0."""
    worker = Worker(tmp_path, "--stub-step-ms", "10").start().wait_ready()
    try:
        client, responses = stream_started(worker, 300)
        worker.process.send_signal(15)
        deadline = time.monotonic() + 5
        while client.is_server_ready() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not client.is_server_ready()
        with pytest.raises(InferenceServerException) as info:
            client.infer("stub", inputs("x", max_tokens=2))
        assert "UNAVAILABLE" in str(info.value.status())
        while True:
            result, error = responses.get(timeout=10)
            assert error is None
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        assert result.as_numpy("num_output_tokens")[0][0] == 300
        client.stop_stream()
        assert worker.process.wait(10) == 0
    finally:
        worker.terminate()


def test_the_engines_code_reaches_the_openai_error_body(gateway):
    """End to end: the engine refuses prompt + max_tokens past the window; the gateway's 400 carries its code (read
    from the worker's structured field, not from the message)."""
    import httpx

    response = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "x" * 2000, "max_tokens": 100}, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and "lower max_tokens to at most 48" in error["message"]


def _tensor(name: str, array: np.ndarray, datatype: str):
    t = triton.InferInput(name, list(array.shape), datatype)
    t.set_data_from_numpy(array)
    return t


def test_logprobs_travel_as_tensors_tritonclient_reads(client):
    """The worker's KServe contract for logprobs (deepspec_protocol/worker.py): TensorRT-LLM's `return_log_probs` input
    and `output_log_probs` output, `input_ids` for a token-id prompt, DeepSpec's top_logprobs / prompt_logprobs inputs
    and the [1, n] / [n, k] scored-token tables; all declared in the ModelConfig the gateway reads."""
    config = client.get_model_config("stub", as_json=True)["config"]
    declared = {t["name"] for t in config["input"]}
    assert {p.INPUT_IDS, p.RETURN_LOG_PROBS, p.EXTRA_TOP_LOGPROBS, p.EXTRA_PROMPT_LOGPROBS} <= declared
    assert set(p.OUTPUT_SCORES.names()) | set(p.PROMPT_SCORES.names()) <= {t["name"] for t in config["output"]}
    prompt = list(b"The ")
    result = client.infer(
        "stub",
        [
            _tensor(p.TEXT_INPUT, np.array([[b""]], dtype=object), "BYTES"),
            _tensor(p.INPUT_IDS, np.array([prompt], dtype=np.int32), "INT32"),
            _tensor(p.MAX_TOKENS, np.array([[5]], dtype=np.int32), "INT32"),
            _tensor(p.RETURN_LOG_PROBS, np.array([[True]], dtype=bool), "BOOL"),
            _tensor(p.EXTRA_TOP_LOGPROBS, np.array([[2]], dtype=np.int32), "INT32"),
            _tensor(p.EXTRA_PROMPT_LOGPROBS, np.array([[1]], dtype=np.int32), "INT32"),
        ],
    )
    assert result.as_numpy(p.TEXT_OUTPUT)[0][0] == b"quick"
    assert result.as_numpy(p.OUTPUT_SCORES.log_probs).tolist() == [[0.0] * 5]  # the stub is sure of every token
    assert result.as_numpy(p.OUTPUT_SCORES.tokens).tolist() == [[b"q", b"u", b"i", b"c", b"k"]]
    assert result.as_numpy(p.OUTPUT_SCORES.top_token_ids).shape == (5, 2)
    assert result.as_numpy(p.OUTPUT_SCORES.top_token_ids)[:, 0].tolist() == list(b"quick")
    assert result.as_numpy(p.PROMPT_SCORES.token_ids).tolist() == [prompt]
    assert np.isnan(result.as_numpy(p.PROMPT_SCORES.log_probs)[0][0])  # nothing predicts the first token
    assert result.as_numpy(p.PROMPT_SCORES.top_log_probs).shape == (len(prompt), 1)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            [_tensor(p.EXTRA_TOP_LOGPROBS, np.array([[2]], dtype=np.int32), "INT32")],
            "top_logprobs needs return_log_probs",
        ),
        ([_tensor(p.INPUT_IDS, np.array([[1, 2]], dtype=np.int32), "INT32")], "send the prompt once"),
        (
            [
                _tensor(p.RETURN_LOG_PROBS, np.array([[True]], dtype=bool), "BOOL"),
                _tensor(p.EXTRA_TOP_LOGPROBS, np.array([[21]], dtype=np.int32), "INT32"),
            ],
            "logprobs must be an integer in [0, 20]",
        ),
    ],
)
def test_bad_logprob_inputs_are_invalid_argument(client, extra, message):
    with pytest.raises(InferenceServerException) as info:
        client.infer("stub", inputs("Hi", max_tokens=2) + extra)
    assert "INVALID_ARGUMENT" in str(info.value.status()) and message in info.value.message()


def _structured_output(value: str):
    return _tensor(p.EXTRA_STRUCTURED_OUTPUT, np.array([[value.encode()]], dtype=object), "BYTES")


def test_a_structured_output_input_constrains_the_engine(client):
    """The worker declares `structured_output` (a Constraint's JSON) and hands it to the engine: the stub, which
    would write its sentence, writes what the regex allows and stops when the regex is complete."""
    config = client.get_model_config("stub", as_json=True)["config"]
    assert p.EXTRA_STRUCTURED_OUTPUT in {t["name"] for t in config["input"]}
    constraint = p.Constraint("regex", "[0-9]{3}").encode()
    result = client.infer("stub", inputs("Hi", max_tokens=20) + [_structured_output(constraint)])
    assert re.fullmatch(b"[0-9]{3}", result.as_numpy(p.TEXT_OUTPUT)[0][0])
    assert result.as_numpy(p.EXTRA_FINISH_REASON)[0][0] == b"stop"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("not json", "is not valid JSON"),
        ('["regex", "a"]', 'must be {"kind": str, "spec": str}'),
        ('{"kind": "regex", "spec": 1}', 'must be {"kind": str, "spec": str}'),
        ('{"kind": "xml", "spec": "<a/>"}', "kind must be one of"),
        ('{"kind": "regex"}', "needs its spec"),
        ('{"kind": "regex", "spec": "([0-9]"}', "invalid regex constraint"),
    ],
)
def test_a_malformed_structured_output_is_invalid_argument_with_the_code(stub_worker, value, message):
    from tritonclient.grpc import service_pb2_grpc

    from service.kserve_messages import service_pb2

    request = service_pb2.ModelInferRequest(model_name="stub", id="s1")
    for t in inputs("Hi", max_tokens=2) + [_structured_output(value)]:
        request.inputs.append(t._get_tensor())
        request.raw_input_contents.append(t._get_content())
    with grpc.insecure_channel(stub_worker.address) as channel, pytest.raises(grpc.RpcError) as info:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in (info.value.details() or "")
    assert _trailers(info.value)[p.ERROR_CODE_METADATA] == "structured_output_invalid"


def _stream_sequences(client, **args) -> tuple[dict[int, str], dict[int, triton.InferResult], list[bool]]:
    """One streamed request → (text per sequence index, each sequence's last response, the final flags in order)."""
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    texts, last, finals = {}, {}, []
    try:
        client.async_stream_infer("stub", inputs("Hello", **args))
        while not finals or not finals[-1]:
            result, error = responses.get(timeout=30)
            assert error is None, error
            index = int(result.as_numpy("sequence_index")[0][0])
            texts[index] = texts.get(index, "") + result.as_numpy("text_output")[0][0].decode()
            last[index] = result
            finals.append(result.get_response().parameters["triton_final_response"].bool_param)
    finally:
        client.stop_stream()
    return texts, last, finals


@pytest.mark.parametrize("stream", [True, False])
def test_num_return_sequences_streams_each_sequence_under_its_index(client, stream):
    """TensorRT-LLM's `num_return_sequences` input and `sequence_index` output (tensorrtllm_backend
    docs/model_config.md): n sequences of one prompt on one stream, each with its own seed (seed + i, as vLLM's
    parallel sampling, vllm/v1/engine/parallel_sampling.py), each sequence exactly the request alone with that seed;
    only the request's last response is final."""
    sampled = dict(max_tokens=24, temperature=1.0, seed=11)
    texts, last, finals = _stream_sequences(client, stream=stream, num_return_sequences=3, **sampled)
    assert sorted(texts) == [0, 1, 2] and finals.count(True) == 1
    if not stream:
        assert len(finals) == 3  # one response per sequence, when it finishes
    for index in range(3):
        alone, _, _ = _stream_sequences(client, stream=True, **{**sampled, "seed": 11 + index})
        assert texts[index] == alone[0]
        result = last[index]
        assert output(result, "finish_reason")[0][0].decode() in ("stop", "length")
        assert output(result, "num_prompt_tokens")[0][0] == len("Hello")
        assert output(result, "num_output_tokens")[0][0] == len(texts[index].encode())


@pytest.mark.parametrize(("n", "message"), [(0, "ask for 1 to"), (9, "do not fit")])
def test_num_return_sequences_out_of_range_is_invalid_argument(client, n, message):
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer("stub", inputs("Hello", stream=True, num_return_sequences=n))
        _, error = responses.get(timeout=30)
    finally:
        client.stop_stream()
    assert error is not None and "INVALID_ARGUMENT" in str(error) and message in str(error)


def test_unary_infer_refuses_several_sequences(client):
    with pytest.raises(InferenceServerException, match="needs ModelStreamInfer") as e:
        client.infer("stub", inputs("Hello", num_return_sequences=2))
    assert "INVALID_ARGUMENT" in str(e.value.status())


def test_logprobs_mode_processed_reaches_the_engine(client):
    """`logprobs_mode` processed_logprobs reaches the engine: the stub puts 0 on the next token and -1e9 elsewhere,
    so at temperature 0.5 the runner-up's processed logprob is twice its raw one (the exact numbers are
    tests/deepspec/decoding/test_logprobs.py's); an unknown mode is INVALID_ARGUMENT."""

    def runner_up(mode):
        extra = [
            _tensor("return_log_probs", np.array([[True]]), "BOOL"),
            _tensor("top_logprobs", np.array([[2]], dtype=np.int32), "INT32"),
        ]
        if mode is not None:
            extra.append(_tensor("logprobs_mode", np.array([[mode.encode()]], dtype=object), "BYTES"))
        result = client.infer("stub", inputs("Hello", max_tokens=4, temperature=0.5, seed=1) + extra)
        return result.as_numpy("output_top_log_probs")[:, 1]

    raw, processed = runner_up(None), runner_up("processed_logprobs")
    np.testing.assert_allclose(processed, 2 * raw, rtol=1e-3)
    with pytest.raises(InferenceServerException, match="logprobs_mode"):
        runner_up("raw_logits")
