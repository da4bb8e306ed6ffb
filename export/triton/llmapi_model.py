"""Triton Python-backend model serving TensorRT-LLM's LLM API with speculative decoding (`tensorrt_llm/1/model.py`).

`python -m export --format triton-repo` copies this file next to `model.yaml` (the LLM options, `speculative_config`
included) and `config.pbtxt` (decoupled: one request, a stream of responses). On a Triton + TensorRT-LLM image:

    tritonserver --model-repository=OUT

Per request, inputs (all [1]; only `text_input` is required): text_input (string), max_tokens (int32), temperature,
top_p (fp32), top_k (int32), streaming (bool), seed (uint64). Responses: `text_output` (the new text: a delta per
response when streaming, else the whole completion once), `finish_reason` ("" until the last response), and the
speculative-decoding counters of the request on the last one: `acceptance_rate`, `total_accepted_draft_tokens`,
`total_draft_tokens`. A bad request gets one error response; the model keeps serving the others.

The LLM runs its own event loop on a thread: `execute` only hands requests to it and returns (decoupled mode), so a
long generation never blocks the next request. Neither `tensorrt_llm` nor `triton_python_backend_utils` is imported
before `initialize`: the file imports anywhere (tests run it with stand-ins for both).
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import numpy as np

#: model.yaml keys that configure Triton rather than the LLM
TRITON_KEYS = ("triton_config",)
#: what max_tokens is when a request leaves it out
DEFAULT_MAX_TOKENS = 128
#: optional request inputs -> (SamplingParams field, numpy cast, valid?)
SAMPLING_INPUTS = {
    "max_tokens": ("max_tokens", int, lambda v: v >= 1),
    "temperature": ("temperature", float, lambda v: v >= 0.0),
    "top_p": ("top_p", float, lambda v: 0.0 < v <= 1.0),
    "top_k": ("top_k", int, lambda v: v >= 0),
    "seed": ("seed", int, lambda v: v >= 0),
}


class BadRequest(ValueError):
    """A request this model refuses; its message goes back to the client as the response's error."""


def load_llm_args(model_yaml: Path) -> dict:
    """model.yaml → LLM(**kwargs): Triton's keys dropped, `speculative_config` turned into TensorRT-LLM's config
    object (its `DecodingBaseConfig.from_dict` picks the class from `decoding_type`)."""
    import yaml

    args = yaml.safe_load(Path(model_yaml).read_text()) or {}
    if not isinstance(args, dict) or "model" not in args:
        raise ValueError(f"{model_yaml}: expected a mapping with at least `model` (the LLM options)")
    for key in TRITON_KEYS:
        args.pop(key, None)
    spec = args.get("speculative_config")
    if isinstance(spec, dict):
        from tensorrt_llm.llmapi.llm_args import DecodingBaseConfig

        args["speculative_config"] = DecodingBaseConfig.from_dict(dict(spec))
    return args


def _scalar(pb_utils, request, name: str):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    values = np.asarray(tensor.as_numpy()).reshape(-1)
    if values.size != 1:
        raise BadRequest(f"{name} must hold one value, got {values.size}")
    return values[0]


def read_request(pb_utils, request) -> tuple[str, dict, bool]:
    """A Triton request → (prompt, SamplingParams kwargs, streaming); BadRequest names what is wrong."""
    raw = _scalar(pb_utils, request, "text_input")
    if raw is None:
        raise BadRequest("text_input is required")
    try:
        prompt = raw.decode("utf-8") if isinstance(raw, (bytes, np.bytes_)) else str(raw)
    except UnicodeDecodeError:
        raise BadRequest("text_input is not valid UTF-8") from None
    if not prompt:
        raise BadRequest("text_input is empty")
    sampling = {"max_tokens": DEFAULT_MAX_TOKENS}
    for name, (field, cast, valid) in SAMPLING_INPUTS.items():
        value = _scalar(pb_utils, request, name)
        if value is None:
            continue
        value = cast(value)
        if not valid(value):
            raise BadRequest(f"{name} {value} is out of range")
        sampling[field] = value
    streaming = _scalar(pb_utils, request, "streaming")
    return prompt, sampling, bool(streaming) if streaming is not None else False


def speculative_counters(output) -> tuple[float, int, int]:
    """(acceptance_rate, total_accepted_draft_tokens, total_draft_tokens) of a finished request; zeros without a
    draft (TensorRT-LLM reports them in request_perf_metrics.speculative_decoding)."""
    metrics = getattr(output, "request_perf_metrics", None)
    spec = getattr(metrics, "speculative_decoding", None)
    if spec is None:
        return 0.0, 0, 0
    return (float(getattr(spec, "acceptance_rate", 0.0) or 0.0), int(getattr(spec, "total_accepted_draft_tokens", 0) or 0),
            int(getattr(spec, "total_draft_tokens", 0) or 0))


class TritonPythonModel:
    """Triton's Python-backend entry points: initialize, execute (decoupled), finalize."""

    def initialize(self, args: dict) -> None:
        import triton_python_backend_utils as pb_utils
        from tensorrt_llm import LLM, SamplingParams

        self.pb_utils = pb_utils
        self.sampling_params = SamplingParams
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise ValueError("this model streams: its config.pbtxt needs model_transaction_policy { decoupled: true }")
        version_dir = Path(args["model_repository"]) / str(args["model_version"])
        self.llm = LLM(**load_llm_args(version_dir / "model.yaml"))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="llmapi-loop", daemon=True)
        self.thread.start()

    def execute(self, requests) -> None:
        for request in requests:
            asyncio.run_coroutine_threadsafe(self._serve(request), self.loop)
        return None

    async def _serve(self, request) -> None:
        pb = self.pb_utils
        sender = request.get_response_sender()
        final = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            prompt, sampling, streaming = read_request(pb, request)
            params = self.sampling_params(**sampling, return_perf_metrics=True)
            result = self.llm.generate_async(prompt, params, streaming=streaming)
            if streaming:  # one response per step; the last one carries the finish reason and the counters
                last = None
                async for out in result:
                    if last is not None:
                        sender.send(self._response(last.outputs[0].text_diff, "", None))
                    last = out
                if last is None:
                    raise RuntimeError("the LLM returned no output")
            else:
                last = await result.aresult()
            completion = last.outputs[0]
            text = completion.text_diff if streaming else completion.text
            sender.send(self._response(text, str(completion.finish_reason or "stop"), speculative_counters(completion)),
                        flags=final)
        except BadRequest as e:
            sender.send(pb.InferenceResponse(error=pb.TritonError(f"bad request: {e}")), flags=final)
        except Exception as e:  # noqa: BLE001 - one request's failure is its own error response
            sender.send(pb.InferenceResponse(error=pb.TritonError(f"{type(e).__name__}: {e}")), flags=final)

    def _response(self, text: str, finish_reason: str, counters: tuple[float, int, int] | None):
        pb = self.pb_utils
        rate, accepted, drafted = counters or (0.0, 0, 0)
        tensors = [pb.Tensor("text_output", np.array([text.encode("utf-8")], dtype=object)),
                   pb.Tensor("finish_reason", np.array([finish_reason.encode("utf-8")], dtype=object)),
                   pb.Tensor("acceptance_rate", np.array([rate], dtype=np.float32)),
                   pb.Tensor("total_accepted_draft_tokens", np.array([accepted], dtype=np.int32)),
                   pb.Tensor("total_draft_tokens", np.array([drafted], dtype=np.int32))]
        return pb.InferenceResponse(output_tensors=tensors)

    def finalize(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.shutdown()
        loop = getattr(self, "loop", None)
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
            self.thread.join(timeout=10)
