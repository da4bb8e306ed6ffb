"""The triton-repo's Python-backend model.py (export/triton/llmapi_model.py) run as Triton would run it, with the
stand-ins of tests/kserve_triton.py for `triton_python_backend_utils`, `tensorrt_llm` and `mpi4py` (none installs
on a CPU machine): it reads model.yaml with its speculative_config, takes the stock LLM-API inputs, streams every step
exactly once, reports the counts, honours cancellation, builds the LLM on rank 0 only, and answers bad requests with
an error while serving the others."""

from __future__ import annotations

import importlib
import sys
import threading
import time
import types

import numpy as np
import pytest
import yaml

from deepspec_protocol.triton_contract import FINISH_REASONS
from tests.export.conftest import run_export
from tests.export.scored_llm import Logprob, distribution, score
from tests.kserve_triton import (
    ACCEPTED_PER_STEP,
    DRAFTED_PER_STEP,
    FINAL,
    SLOW_PROMPT,
    WORDS,
    FakeMPI,
    Request,
    ScriptedLLM,
    fakes_installed,
    initialize,
    load_model_py,
    parse_config,
)


class _Sender:
    def __init__(self):
        self.responses, self.flags, self.done = [], [], threading.Event()

    def send(self, response=None, flags=0):
        self.responses.append(response)
        self.flags.append(flags)
        if flags & FINAL:
            self.done.set()


@pytest.fixture(scope="module")
def repo(tmp_path_factory, targets, drafts):
    out = tmp_path_factory.mktemp("triton-model") / "repo"
    result = run_export(
        "--target",
        targets["llama"],
        "--draft",
        drafts["llama", "eagle3"],
        "--format",
        "triton-repo",
        "--num-speculative-tokens",
        "4",
        "--tp",
        "2",
        "--out",
        out,
    )
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture()
def model(repo):
    with fakes_installed(FakeMPI(rank=0, size=2)):
        m = initialize(repo / "tensorrt_llm", parse_config(repo / "tensorrt_llm" / "config.pbtxt"))
        yield m
        m.finalize()


def _send(model, request_id="r", **inputs):
    request = Request({name: np.asarray(value) for name, value in inputs.items()}, request_id, _Sender())
    assert model.execute([request]) is None  # decoupled: responses go through the sender
    return request


def _ask(model, **inputs):
    request = _send(model, **inputs)
    assert request.get_response_sender().done.wait(10), "no final response"
    return request.get_response_sender().responses


def _text(s: str):
    return np.array([s.encode()], dtype=object)


def _out(response, name):
    return response.output_tensors[[t.name() for t in response.output_tensors].index(name)].as_numpy()[0]


def test_repository_ships_model_py_that_imports_without_triton_or_tensorrt_llm(repo):
    module = load_model_py(repo / "tensorrt_llm" / "1" / "model.py")
    assert hasattr(module.TritonPythonModel, "execute")
    assert "tensorrt_llm" not in sys.modules and "triton_python_backend_utils" not in sys.modules
    assert module.contract.__file__ == str(repo / "tensorrt_llm" / "1" / "triton_contract.py")


def test_llm_is_built_on_rank_0_over_the_mpi_world_with_its_speculative_config(repo, model):
    """NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/1/model.py, TritonPythonModel.initialize:
    the leader (global_mpi_rank() == 0) builds LLM(**args) with `_mpi_session = MpiCommSession(COMM_WORLD,
    n_workers=COMM_WORLD.Get_size())` when global_mpi_size() > 1."""
    (llm,) = ScriptedLLM.instances
    options = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert llm.kwargs["model"] == options["model"] and "triton_config" not in llm.kwargs
    assert llm.kwargs["tensor_parallel_size"] == 2 and llm.kwargs["_mpi_session"] == ("mpi-session", 2)
    draft = options["speculative_config"]["speculative_model_dir"]
    assert llm.kwargs["speculative_config"] == ("decoding-config", "Eagle", 4, draft)


def test_other_ranks_serve_the_leader_and_build_no_llm(repo):
    """The same initialize: a rank other than 0 enters `MPICommExecutor(COMM_WORLD)` (where it runs the leader's
    work) and builds nothing itself."""
    mpi = FakeMPI(rank=1, size=2)
    with fakes_installed(mpi):
        follower = initialize(repo / "tensorrt_llm", parse_config(repo / "tensorrt_llm" / "config.pbtxt"))
        follower.finalize()
    assert ScriptedLLM.instances == [] and mpi.executors == 1 and mpi.sessions == []


def test_a_world_that_does_not_match_model_yaml_is_refused(repo):
    with fakes_installed(FakeMPI(rank=0, size=4)), pytest.raises(ValueError, match="asks for 2 ranks.*started 4"):
        initialize(repo / "tensorrt_llm", parse_config(repo / "tensorrt_llm" / "config.pbtxt"))


def test_streaming_sends_every_step_once_in_order_then_the_counters(model):
    """TensorRT-LLM's GenerationResult is one object mutated in place (tensorrt_llm/executor/result.py:
    `__anext__` returns self; CompletionOutput.text_diff is what the latest step added): each response must be
    built in the iteration that produced it, or the first chunk is lost and the last repeated."""
    responses = _ask(
        model, text_input=_text("hi"), streaming=np.array([True]), sampling_param_max_tokens=np.array([3], np.int32)
    )
    assert all(r.error is None for r in responses)
    assert [_out(r, "text_output").decode() for r in responses] == list(WORDS[:3])
    assert [_out(r, "finish_reason").decode() for r in responses] == ["", "", "length"]
    last = responses[-1]
    assert _out(last, "total_draft_tokens") == 3 * DRAFTED_PER_STEP
    assert _out(last, "total_accepted_draft_tokens") == 3 * ACCEPTED_PER_STEP
    assert _out(last, "acceptance_rate") == pytest.approx(ACCEPTED_PER_STEP / DRAFTED_PER_STEP)
    assert (_out(last, "num_input_tokens"), _out(last, "num_output_tokens")) == (2, 3)


def test_one_response_without_streaming_and_sampling_inputs_reach_the_llm(model):
    (response,) = _ask(
        model,
        text_input=_text("hi"),
        sampling_param_max_tokens=np.array([2], np.int32),
        sampling_param_temperature=np.array([0.5], np.float32),
        sampling_param_top_k=np.array([4], np.int32),
        sampling_param_seed=np.array([7], np.uint64),
        sampling_param_stop=np.array([b"\n\n", b"END"], dtype=object),
        ignore_eos=np.array([True]),
    )
    assert _out(response, "text_output").decode() == "".join(WORDS[:2])
    _, params, streaming = ScriptedLLM.instances[0].calls[-1]
    assert not streaming and params.return_perf_metrics and params.ignore_eos
    assert (params.max_tokens, params.temperature, params.top_k, params.seed) == (2, 0.5, 4, 7)
    assert params.stop == ["\n\n", "END"]


def test_chat_messages_are_rendered_with_the_targets_template(model):
    (response,) = _ask(
        model,
        text_input=_text(""),
        messages_json=_text('[{"role": "user", "content": "hey"}]'),
        sampling_param_max_tokens=np.array([1], np.int32),
    )
    assert response.error is None
    assert ScriptedLLM.instances[0].calls[-1][0] == "<user>hey<assistant>"


def _bos_tokenizer():
    """A Llama-style tokenizer: its post-processor prepends BOS, and its chat template writes BOS too."""
    from tokenizers import Tokenizer, models, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{chr(c): 3 + i for i, c in enumerate(range(32, 127))}}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tokenizer.chat_template = "{{ bos_token }}{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    return tokenizer


@pytest.mark.parametrize(
    "inputs, bos_in_template",
    [
        ({"text_input": _text(""), "messages_json": _text('[{"role": "user", "content": "hey"}]')}, True),
        ({"text_input": _text("hey")}, False),
    ],
)
def test_a_chat_prompt_gets_one_bos_and_a_plain_prompt_keeps_its_own(model, inputs, bos_in_template):
    """TensorRT-LLM tokenizes a text prompt with `tokenizer.encode(prompt, add_special_tokens=
    sampling_params.add_special_tokens)` (tensorrt_llm/inputs/registry.py `DefaultInputProcessor.__call__`, 1.2.1;
    `SamplingParams.add_special_tokens` defaults to True), and its own chat path turns that off because the
    template already wrote BOS (tensorrt_llm/serve/openai_protocol.py `ChatCompletionRequest.add_special_tokens`,
    default False). A Llama/Mistral chat prompt tokenized with special tokens starts with two BOS."""
    tokenizer = _bos_tokenizer()
    llm = ScriptedLLM.instances[0]
    llm.tokenizer = tokenizer
    (response,) = _ask(model, **inputs, sampling_param_max_tokens=np.array([1], np.int32))
    assert response.error is None
    prompt, params, _ = llm.calls[-1]
    ids = tokenizer.encode(prompt, add_special_tokens=getattr(params, "add_special_tokens", True))
    bos = tokenizer.bos_token_id
    assert isinstance(bos, int)
    assert ids[0] == bos and ids.count(bos) == 1
    assert prompt.startswith("<s>") == bos_in_template


def test_a_cancelled_request_is_aborted_and_ends_cancelled(model):
    """NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/1/model.py, cancellation_loop: a request
    whose `is_cancelled()` turns true is aborted (`response_iterator.abort()`) and answered with
    TritonError("Request cancelled by client", TritonError.CANCELLED)."""
    request = _send(model, text_input=_text(SLOW_PROMPT), streaming=np.array([True]))
    sender = request.get_response_sender()
    deadline = time.monotonic() + 5
    while not sender.responses:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    request.cancelled.set()
    assert sender.done.wait(5), "a cancelled request never ended"
    error = sender.responses[-1].error
    assert error is not None and error.code() == "CANCELLED"
    assert not model.running


@pytest.mark.parametrize(
    "trtllm_reason, sent",
    [("stop", "stop"), ("length", "length"), (None, "stop"), ("cancelled", "abort"), ("timeout", "abort")],
)
def test_a_finished_sequence_sends_the_contracts_finish_reason(model, trtllm_reason, sent):
    """TensorRT-LLM's CompletionOutput.finish_reason has values of its own ("cancelled", "timeout"); the model sends
    the contract's FINISH_REASONS, the values DeepSpec's worker sends and the gateway labels its metrics with."""
    completion = types.SimpleNamespace(finish_reason=trtllm_reason, token_ids=[1, 2], request_perf_metrics=None)
    out = types.SimpleNamespace(outputs=[completion], finished=True, prompt_token_ids=[5])
    reason = _out(model._response(out, "x"), "finish_reason").decode()
    assert reason == sent and reason in FINISH_REASONS


@pytest.mark.parametrize(
    "inputs, message",
    [
        ({}, "text_input is required"),
        ({"text_input": _text("")}, "text_input is empty"),
        (
            {"text_input": _text("hi"), "sampling_param_max_tokens": np.array([0], np.int32)},
            "sampling_param_max_tokens 0 is out of range",
        ),
        (
            {"text_input": _text("hi"), "sampling_param_top_p": np.array([1.5], np.float32)},
            "sampling_param_top_p 1.5 is out of range",
        ),
        ({"text_input": _text(""), "messages_json": _text("{}")}, "non-empty JSON list"),
        ({"text_input": _text("boom")}, "RuntimeError: engine fell over"),
    ],
)
def test_bad_requests_get_an_error_and_the_model_keeps_serving(model, inputs, message):
    (response,) = _ask(model, **inputs)
    assert response.error is not None and message in response.error.message()
    (ok,) = _ask(model, text_input=_text("again"), sampling_param_max_tokens=np.array([1], np.int32))
    assert ok.error is None and _out(ok, "text_output").decode() == WORDS[0]


def test_every_output_the_model_sends_is_declared_in_its_config(repo, model):
    score(ScriptedLLM.instances[0])
    (response,) = _ask(
        model,
        text_input=_text("hi"),
        sampling_param_max_tokens=np.array([1], np.int32),
        return_log_probs=np.array([True]),
        top_logprobs=np.array([2], np.int32),
    )
    declared = {o.name for o in parse_config(repo / "tensorrt_llm" / "config.pbtxt").output}
    assert "output_top_tokens" in {t.name() for t in response.output_tensors} <= declared


def test_a_model_config_that_does_not_stream_is_refused(repo):
    config = parse_config(repo / "tensorrt_llm" / "config.pbtxt")
    config.model_transaction_policy.decoupled = False
    with fakes_installed(), pytest.raises(ValueError, match="decoupled: true"):
        initialize(repo / "tensorrt_llm", config)


def test_finalize_shuts_the_llm_down(repo):
    with fakes_installed(FakeMPI(rank=0, size=2)):
        m = initialize(repo / "tensorrt_llm", parse_config(repo / "tensorrt_llm" / "config.pbtxt"))
        m.finalize()
    assert ScriptedLLM.instances[-1].closed and not m.thread.is_alive()


# -- logprobs --------------------------------------------------------------------------------------------------------


def _scores(response) -> dict:
    names = [t.name() for t in response.output_tensors]
    return {name.removeprefix("output_"): _all(response, name) for name in names if name.startswith("output_")}


def _all(response, name):
    return response.output_tensors[[t.name() for t in response.output_tensors].index(name)].as_numpy()


def test_streamed_logprobs_are_the_llms_in_the_workers_tensors(model):
    """Each response carries the tokens its text adds, in DeepSpec's worker's tensors (deepspec_protocol/worker.py
    OUTPUT_SCORES): the sampled token's logprob read from its dict as TensorRT-LLM's own server reads it
    (tensorrt_llm/serve/postprocess_handlers.py create_logprobs: `logprob[token_id].logprob`), the likeliest
    alternatives first and only as many as asked, though the dict also holds the sampled token."""
    score(ScriptedLLM.instances[0])
    responses = _ask(
        model,
        text_input=_text("hi"),
        streaming=np.array([True]),
        sampling_param_max_tokens=np.array([3], np.int32),
        return_log_probs=np.array([True]),
        top_logprobs=np.array([1], np.int32),
    )
    assert all(r.error is None for r in responses), [r.error.message() for r in responses if r.error]
    _, params, _ = ScriptedLLM.instances[0].calls[-1]
    assert params.logprobs == 1
    for step, response in enumerate(responses):
        scores = _scores(response)
        assert scores["token_ids"].tolist() == [100 + step]
        assert scores["tokens"].tolist() == [WORDS[step].encode()] == [_out(response, "text_output")]
        assert scores["log_probs"].tolist() == pytest.approx([distribution(step)[1][1]])
        assert scores["top_token_ids"].tolist() == [[200 + step]]
        assert scores["top_log_probs"].tolist() == [[pytest.approx(-0.05)]]
        assert scores["top_tokens"].tolist() == [[f"<alt{200 + step}>".encode()]]


def test_whole_logprobs_without_alternatives_still_ask_the_llm_for_one(model):
    """top_logprobs 0 asks TensorRT-LLM for logprobs=1 (compute_logprobs scores nothing at 0 in some releases) and
    sends no alternatives' tensors, as DeepSpec's worker sends none for k = 0."""
    score(ScriptedLLM.instances[0])
    (response,) = _ask(
        model,
        text_input=_text("hi"),
        sampling_param_max_tokens=np.array([3], np.int32),
        return_log_probs=np.array([True]),
    )
    assert response.error is None
    _, params, _ = ScriptedLLM.instances[0].calls[-1]
    assert params.logprobs == 1
    scores = _scores(response)
    assert set(scores) == {"log_probs", "token_ids", "tokens"}
    assert scores["token_ids"].tolist() == [100, 101, 102]
    assert b"".join(scores["tokens"].tolist()) == _out(response, "text_output")
    assert scores["log_probs"].tolist() == pytest.approx([-0.1, -0.2, -0.3])


def test_a_request_without_logprobs_asks_the_llm_for_none(model):
    score(ScriptedLLM.instances[0])
    (response,) = _ask(model, text_input=_text("hi"), sampling_param_max_tokens=np.array([2], np.int32))
    _, params, _ = ScriptedLLM.instances[0].calls[-1]
    assert not hasattr(params, "logprobs") and not _scores(response)


def test_token_texts_are_what_each_token_adds_in_context(repo):
    """A character split across tokens is the text of the token that completes it ("" before), so the texts add up
    to the output's (a byte-level tokenizer: one token per UTF-8 byte)."""
    module = load_model_py(repo / "tensorrt_llm" / "1" / "model.py")
    tokenizer = types.SimpleNamespace(
        decode=lambda ids, skip_special_tokens=False: bytes(ids).decode("utf-8", "replace")
    )
    scores = module.OutputScores(tokenizer, 0)
    text = "é€!"
    ids = list(text.encode())
    completion = types.SimpleNamespace(token_ids=ids, logprobs=[{t: Logprob(-1.0, 1)} for t in ids])
    pb = types.SimpleNamespace(Tensor=lambda name, array: (name, array))
    tensors = dict(scores.tensors(pb, completion))
    assert [t.decode() for t in tensors["output_tokens"]] == ["", "é", "", "", "€", "!"]
    assert scores.tensors(pb, completion) == []  # nothing new since


def test_a_top_logprobs_out_of_range_is_a_bad_request(model):
    (response,) = _ask(
        model,
        text_input=_text("hi"),
        sampling_param_max_tokens=np.array([1], np.int32),
        return_log_probs=np.array([True]),
        top_logprobs=np.array([21], np.int32),
    )
    assert response.error is not None and "top_logprobs 21 is out of range (0..20)" in response.error.message()


def test_an_llm_that_leaves_the_sampled_token_unscored_is_an_error_not_a_guess(repo):
    """A TensorRT-LLM release that returns only the top-k (its llm_inference_logprob example: "sampled token NOT
    guaranteed") gives no logprob for a token outside them: the request fails rather than answer a made-up one."""
    module = load_model_py(repo / "tensorrt_llm" / "1" / "model.py")
    tokenizer = types.SimpleNamespace(decode=lambda ids, skip_special_tokens=False: "x" * len(ids))
    completion = types.SimpleNamespace(token_ids=[7], logprobs=[{3: Logprob(-0.1, 1)}])
    with pytest.raises(RuntimeError, match="scored token 7 with \\[3\\]"):
        module.OutputScores(tokenizer, 1).tensors(types.SimpleNamespace(Tensor=None), completion)


class _MetricFamily:
    """Triton's Python-backend custom metrics (python_backend src/resources/triton_python_backend_utils.py
    `MetricFamily(name, description, kind)`, `.Metric(labels)`, `Metric.increment` / `set` / `value`), in memory."""

    GAUGE, COUNTER = "gauge", "counter"
    families: dict = {}

    def __init__(self, name, description, kind):
        self.name, self.kind, self.metrics = name, kind, []
        _MetricFamily.families[name] = self

    def Metric(self, labels):
        metric = types.SimpleNamespace(labels=labels, current=0.0)
        metric.increment = lambda v: setattr(metric, "current", metric.current + v)
        metric.set = lambda v: setattr(metric, "current", v)
        metric.value = lambda: metric.current
        self.metrics.append(metric)
        return metric


def test_the_model_exports_its_queue_as_gauges_the_autoscaler_reads(repo, monkeypatch):
    """The series helm/tools/engine_metrics.py names for the triton runtime's queue exist only because this model
    emits them: waiting until a request's first token, running until it ends, both back to 0 after."""
    from export.triton.llmapi_model import RequestGauges
    from tests.export.conftest import REPO

    sys.path.insert(0, str(REPO / "helm" / "tools"))
    try:
        engine_metrics = importlib.import_module("engine_metrics")  # a script of helm/tools, not a package
    finally:
        sys.path.pop(0)
    triton = engine_metrics.RUNTIMES["triton"]
    assert triton["num_requests_waiting"].metric == RequestGauges.WAITING
    assert triton["num_requests_running"].metric == RequestGauges.RUNNING
    _MetricFamily.families.clear()
    with fakes_installed(FakeMPI(rank=0, size=2)):
        monkeypatch.setattr(sys.modules["triton_python_backend_utils"], "MetricFamily", _MetricFamily, raising=False)
        m = initialize(repo / "tensorrt_llm", parse_config(repo / "tensorrt_llm" / "config.pbtxt"))
        try:
            waiting, running = (
                _MetricFamily.families[n].metrics[0] for n in (RequestGauges.WAITING, RequestGauges.RUNNING)
            )
            assert waiting.labels == running.labels == {"model": "tensorrt_llm"}
            request = _send(m, text_input=_text(SLOW_PROMPT), streaming=np.array([True]))
            for _ in range(200):
                if running.value() == 1:
                    break
                time.sleep(0.01)
            assert (waiting.value(), running.value()) == (0, 1)
            request.cancelled.set()
            assert request.get_response_sender().done.wait(10)
            for _ in range(200):
                if running.value() == 0:
                    break
                time.sleep(0.01)
            assert (waiting.value(), running.value()) == (0, 0)
        finally:
            m.finalize()
