"""The triton-repo's Python-backend model.py (export/triton/llmapi_model.py) run as Triton would run it, with stand-ins
for `triton_python_backend_utils` and `tensorrt_llm` (neither installs on a CPU machine): it reads model.yaml with
its speculative_config, streams text, reports the acceptance counters, and answers bad requests with an error
while serving the others."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import types

import numpy as np
import pytest
import yaml

from tests.export.conftest import run_export

FINAL = 1


class _Tensor:
    def __init__(self, name, array):
        self.name, self._array = name, array

    def as_numpy(self):
        return self._array


class _Response:
    def __init__(self, output_tensors=None, error=None):
        self.tensors = {t.name: t.as_numpy() for t in output_tensors or []}
        self.error = error


class _Error:
    def __init__(self, message):
        self.message = message


class _Sender:
    def __init__(self):
        self.responses, self.done = [], threading.Event()

    def send(self, response=None, flags=0):
        self.responses.append(response)
        if flags & FINAL:
            self.done.set()


class _Request:
    def __init__(self, **inputs):
        self.inputs = {name: _Tensor(name, value) for name, value in inputs.items()}
        self.sender = _Sender()

    def get_response_sender(self):
        return self.sender


def _pb_utils() -> types.ModuleType:
    pb = types.ModuleType("triton_python_backend_utils")
    pb.Tensor, pb.InferenceResponse, pb.TritonError = _Tensor, _Response, _Error
    pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL = FINAL
    pb.get_input_tensor_by_name = lambda request, name: request.inputs.get(name)
    pb.using_decoupled_model_transaction_policy = lambda config: config["model_transaction_policy"]["decoupled"]
    return pb


class _Completion:
    def __init__(self, text, diff, finish_reason=None, spec=None):
        self.text, self.text_diff, self.finish_reason = text, diff, finish_reason
        self.request_perf_metrics = types.SimpleNamespace(speculative_decoding=spec) if spec else None


class _Result:
    """generate_async's result: async-iterable when streaming, `aresult()` otherwise."""

    def __init__(self, words, spec):
        self.steps = []
        for i in range(len(words)):
            last = i == len(words) - 1
            self.steps.append(types.SimpleNamespace(finished=last, outputs=[_Completion(
                " ".join(words[: i + 1]), (" " if i else "") + words[i], "length" if last else None,
                spec if last else None)]))

    def __aiter__(self):
        async def gen():
            for step in self.steps:
                yield step
        return gen()

    async def aresult(self):
        return self.steps[-1]


class _LLM:
    instances: list = []

    def __init__(self, **kwargs):
        self.kwargs, self.calls, self.closed = kwargs, [], False
        _LLM.instances.append(self)

    def generate_async(self, prompt, params, streaming=False):
        self.calls.append((prompt, params, streaming))
        if prompt == "boom":
            raise RuntimeError("engine fell over")
        spec = types.SimpleNamespace(acceptance_rate=0.75, total_accepted_draft_tokens=6, total_draft_tokens=8)
        return _Result(["alpha", "beta", "gamma"][: params.max_tokens], spec)

    def shutdown(self):
        self.closed = True


class _DecodingBaseConfig:
    @staticmethod
    def from_dict(d):
        return ("decoding-config", d["decoding_type"], d["max_draft_len"], d["speculative_model_dir"])


@pytest.fixture()
def fakes(monkeypatch):
    trt = types.ModuleType("tensorrt_llm")
    trt.LLM = _LLM
    trt.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)
    llmapi = types.ModuleType("tensorrt_llm.llmapi")
    llm_args = types.ModuleType("tensorrt_llm.llmapi.llm_args")
    llm_args.DecodingBaseConfig = _DecodingBaseConfig
    for name, module in (("tensorrt_llm", trt), ("tensorrt_llm.llmapi", llmapi),
                         ("tensorrt_llm.llmapi.llm_args", llm_args), ("triton_python_backend_utils", _pb_utils())):
        monkeypatch.setitem(sys.modules, name, module)
    _LLM.instances.clear()


@pytest.fixture(scope="module")
def repo(tmp_path_factory, targets, drafts):
    out = tmp_path_factory.mktemp("triton-model") / "repo"
    result = run_export("--target", targets["llama"], "--draft", drafts["llama", "eagle3"], "--format", "triton-repo",
                        "--num-speculative-tokens", "4", "--out", out)
    assert result.returncode == 0, result.stderr
    return out


def _load_model_py(path):
    spec = importlib.util.spec_from_file_location("exported_triton_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def model(repo, fakes):
    module = _load_model_py(repo / "tensorrt_llm" / "1" / "model.py")
    config = {"model_transaction_policy": {"decoupled": True}}
    m = module.TritonPythonModel()
    m.initialize({"model_config": json.dumps(config), "model_repository": str(repo / "tensorrt_llm"),
                  "model_version": "1"})
    yield m
    m.finalize()


def _ask(model, **inputs):
    request = _Request(**inputs)
    assert model.execute([request]) is None  # decoupled: responses go through the sender
    assert request.sender.done.wait(10), "no final response"
    return request.sender.responses


def _text(s: str):
    return np.array([s.encode()], dtype=object)


def test_repository_ships_model_py_that_imports_without_triton_or_tensorrt_llm(repo):
    module = _load_model_py(repo / "tensorrt_llm" / "1" / "model.py")
    assert hasattr(module.TritonPythonModel, "execute")
    assert "tensorrt_llm" not in sys.modules and "triton_python_backend_utils" not in sys.modules


def test_llm_is_built_from_model_yaml_with_its_speculative_config(repo, model):
    (llm,) = _LLM.instances
    options = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert llm.kwargs["model"] == options["model"] and "triton_config" not in llm.kwargs
    assert llm.kwargs["speculative_config"] == ("decoding-config", "Eagle3", 4, options["speculative_config"]["speculative_model_dir"])


def test_streaming_sends_deltas_then_the_counters(model):
    responses = _ask(model, text_input=_text("hi"), streaming=np.array([True]), max_tokens=np.array([3], np.int32))
    assert all(r.error is None for r in responses)
    assert "".join(r.tensors["text_output"][0].decode() for r in responses) == "alpha beta gamma"
    assert [r.tensors["finish_reason"][0].decode() for r in responses] == ["", "", "length"]
    last = responses[-1].tensors
    assert last["acceptance_rate"][0] == pytest.approx(0.75)
    assert (last["total_accepted_draft_tokens"][0], last["total_draft_tokens"][0]) == (6, 8)


def test_one_response_without_streaming_and_sampling_inputs_reach_the_llm(model):
    (response,) = _ask(model, text_input=_text("hi"), max_tokens=np.array([2], np.int32),
                       temperature=np.array([0.5], np.float32), top_k=np.array([4], np.int32),
                       seed=np.array([7], np.uint64))
    assert response.tensors["text_output"][0].decode() == "alpha beta"
    _, params, streaming = _LLM.instances[0].calls[-1]
    assert not streaming and params.return_perf_metrics
    assert (params.max_tokens, params.temperature, params.top_k, params.seed) == (2, 0.5, 4, 7)


@pytest.mark.parametrize("inputs, message", [
    ({}, "text_input is required"),
    ({"text_input": _text("")}, "text_input is empty"),
    ({"text_input": _text("hi"), "max_tokens": np.array([0], np.int32)}, "max_tokens 0 is out of range"),
    ({"text_input": _text("hi"), "top_p": np.array([1.5], np.float32)}, "top_p 1.5 is out of range"),
    ({"text_input": _text("boom")}, "RuntimeError: engine fell over"),
])
def test_bad_requests_get_an_error_and_the_model_keeps_serving(model, inputs, message):
    (response,) = _ask(model, **inputs)
    assert response.error is not None and message in response.error.message
    (ok,) = _ask(model, text_input=_text("again"), max_tokens=np.array([1], np.int32))
    assert ok.error is None and ok.tensors["text_output"][0].decode() == "alpha"


def test_a_model_config_that_does_not_stream_is_refused(repo, fakes):
    module = _load_model_py(repo / "tensorrt_llm" / "1" / "model.py")
    with pytest.raises(ValueError, match="decoupled: true"):
        module.TritonPythonModel().initialize({"model_config": json.dumps({"model_transaction_policy": {"decoupled": False}}),
                                               "model_repository": str(repo / "tensorrt_llm"), "model_version": "1"})


def test_finalize_shuts_the_llm_down(repo, fakes):
    module = _load_model_py(repo / "tensorrt_llm" / "1" / "model.py")
    m = module.TritonPythonModel()
    m.initialize({"model_config": json.dumps({"model_transaction_policy": {"decoupled": True}}),
                  "model_repository": str(repo / "tensorrt_llm"), "model_version": "1"})
    m.finalize()
    assert _LLM.instances[-1].closed and not m.thread.is_alive()
