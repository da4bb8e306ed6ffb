"""Triton Python-backend model serving TensorRT-LLM's LLM API with speculative decoding (`tensorrt_llm/1/model.py`).

`python -m export --format triton-repo` copies this file next to `model.yaml` (the LLM options, `speculative_config`
included), `triton_contract.py` (the tensor names, shared with the gateway) and `config.pbtxt` (decoupled: one
request, a stream of responses). On a Triton + TensorRT-LLM image:

    tritonserver --model-repository=OUT

Inputs are the stock LLM-API model's (`text_input`, `streaming`, `sampling_param_*`, `stop`) plus optional
additions: `messages_json` (chat messages, rendered with the target's chat template), `ignore_eos`, and
`return_log_probs` with `top_logprobs` (the generated tokens' logprobs and this many alternatives each). Responses:
`text_output` (the new text: a delta per response when streaming, else the whole completion once), `finish_reason`
("" until the last response) and the request's counts so far: `num_input_tokens`, `num_output_tokens`,
`acceptance_rate`, `total_accepted_draft_tokens`, `total_draft_tokens`; with logprobs, the scores of the tokens the
response's text adds, in DeepSpec's worker's tensors (`OutputScores`), so a gateway reads both alike. A bad
request gets one error response; the model keeps serving the others. A request the client cancels
(`request.is_cancelled()`, polled every `triton_config.cancellation_check_period_ms`) is aborted in the LLM and ends
with a CANCELLED error.

Tensor parallelism: under `mpirun -n N ... trtllm-llmapi-launch tritonserver` every rank loads this model. Rank 0
builds the LLM over the MPI world (an `MpiCommSession` on COMM_WORLD) and serves; the other ranks turn into its MPI
workers (`MPICommExecutor`) and never serve. With one rank the LLM starts its own workers.

The LLM runs its own event loop on a thread: `execute` only hands requests to it and returns (decoupled mode), so a
long generation never blocks the next request. Neither `tensorrt_llm`, `mpi4py` nor `triton_python_backend_utils` is
imported before `initialize`: the file imports anywhere (tests run it with stand-ins for all three).
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import sys
import threading
from pathlib import Path

import numpy as np

#: model.yaml keys that configure Triton rather than the LLM
TRITON_KEYS = ("triton_config",)
#: what max_tokens is when a request leaves it out
DEFAULT_MAX_TOKENS = 128
#: how often a running request's cancellation is checked when model.yaml does not say
DEFAULT_CANCELLATION_CHECK_PERIOD_MS = 100
#: the most alternatives per generated token a request may ask for (the gateway's bound, OpenAI's top_logprobs)
MAX_TOP_LOGPROBS = 20
#: role -> (SamplingParams field, cast, valid?) of the optional one-value inputs
SAMPLING_ROLES = {
    "max_tokens": ("max_tokens", int, lambda v: v >= 1),
    "temperature": ("temperature", float, lambda v: v >= 0.0),
    "top_p": ("top_p", float, lambda v: 0.0 < v <= 1.0),
    "top_k": ("top_k", int, lambda v: v >= 0),
    "seed": ("seed", int, lambda v: v >= 0),
    "ignore_eos": ("ignore_eos", bool, lambda v: True),
}


def load_contract():
    """The Triton contract: the copy the exporter puts beside this file, else the repository's own module."""
    path = Path(__file__).with_name("triton_contract.py")
    if not path.is_file():
        from deepspec_protocol import triton_contract

        return triton_contract
    spec = importlib.util.spec_from_file_location("triton_contract", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # its dataclasses look their module up while they are built
    spec.loader.exec_module(module)
    return module


contract = load_contract()
NAMES = contract.LLMAPI_NAMES


class BadRequest(ValueError):
    """A request this model refuses; its message goes back to the client as the response's error."""


def read_model_yaml(model_yaml: Path) -> dict:
    import yaml

    args = yaml.safe_load(Path(model_yaml).read_text()) or {}
    if not isinstance(args, dict) or "model" not in args:
        raise ValueError(f"{model_yaml}: expected a mapping with at least `model` (the LLM options)")
    return args


def load_llm_args(model_yaml: Path) -> dict:
    """model.yaml → LLM(**kwargs): Triton's keys dropped, `speculative_config` turned into TensorRT-LLM's config
    object (its `DecodingBaseConfig.from_dict` picks the class from `decoding_type`)."""
    args = read_model_yaml(model_yaml)
    for key in TRITON_KEYS:
        args.pop(key, None)
    spec = args.get("speculative_config")
    if isinstance(spec, dict):
        # TensorRT-LLM is installed in the Triton image only, never in the checkout's venv
        from tensorrt_llm.llmapi.llm_args import DecodingBaseConfig  # pyright: ignore[reportMissingImports]

        args["speculative_config"] = DecodingBaseConfig.from_dict(dict(spec))
    return args


def world_size_of(llm_args: dict) -> int:
    """The ranks model.yaml's LLM runs on: tensor_parallel_size x pipeline_parallel_size."""
    return int(llm_args.get("tensor_parallel_size", 1) or 1) * int(llm_args.get("pipeline_parallel_size", 1) or 1)


def _values(pb_utils, request, name: str):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else np.asarray(tensor.as_numpy()).reshape(-1)


def _scalar(pb_utils, request, name: str):
    values = _values(pb_utils, request, name)
    if values is None:
        return None
    if values.size != 1:
        raise BadRequest(f"{name} must hold one value, got {values.size}")
    return values[0]


def _text(raw, name: str) -> str:
    try:
        return raw.decode("utf-8") if isinstance(raw, (bytes, np.bytes_)) else str(raw)
    except UnicodeDecodeError:
        raise BadRequest(f"{name} is not valid UTF-8") from None


def read_request(pb_utils, request) -> tuple[str | None, list | None, dict, bool]:
    """A Triton request → (prompt, chat messages or None, SamplingParams kwargs, streaming); BadRequest names what
    is wrong. `text_input` is [n] (upstream's dims): its first element is the prompt."""
    texts = _values(pb_utils, request, NAMES["prompt"])
    if texts is None or texts.size == 0:
        raise BadRequest(f"{NAMES['prompt']} is required")
    prompt = _text(texts[0], NAMES["prompt"])
    messages = None
    raw_messages = _scalar(pb_utils, request, NAMES["messages"])
    if raw_messages is not None:
        try:
            messages = json.loads(_text(raw_messages, NAMES["messages"]))
        except json.JSONDecodeError as e:
            raise BadRequest(f"{NAMES['messages']} is not JSON: {e}") from None
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise BadRequest(f"{NAMES['messages']} must be a non-empty JSON list of messages")
    elif not prompt:
        raise BadRequest(f"{NAMES['prompt']} is empty")
    sampling: dict[str, object] = {"max_tokens": DEFAULT_MAX_TOKENS}
    for role, (field, cast, valid) in SAMPLING_ROLES.items():
        value = _scalar(pb_utils, request, NAMES[role])
        if value is None:
            continue
        value = cast(value)
        if not valid(value):
            raise BadRequest(f"{NAMES[role]} {value} is out of range")
        sampling[field] = value
    stop = _values(pb_utils, request, NAMES["stop"])
    if stop is not None and stop.size:
        sampling["stop"] = [_text(s, NAMES["stop"]) for s in stop]
    streaming = _scalar(pb_utils, request, NAMES["stream"])
    return prompt, messages, sampling, bool(streaming) if streaming is not None else False


def read_num_top_logprobs(pb_utils, request) -> int | None:
    """The alternatives per generated token a request asks for (`return_log_probs`, `top_logprobs`); None = no
    logprobs."""
    if not _scalar(pb_utils, request, NAMES["return_log_probs"]):
        return None
    num_top = _scalar(pb_utils, request, NAMES["top_logprobs"])
    num_top = 0 if num_top is None else int(num_top)
    if not 0 <= num_top <= MAX_TOP_LOGPROBS:
        raise BadRequest(f"{NAMES['top_logprobs']} {num_top} is out of range (0..{MAX_TOP_LOGPROBS})")
    return num_top


class OutputScores:
    """One request's generated tokens, scored: `tensors(completion)` gives the output tensors of the tokens scored
    since the last call, as DeepSpec's worker sends them (the contract's SCORE_OUTPUTS, deepspec_protocol/worker.py
    OUTPUT_SCORES).

    TensorRT-LLM's CompletionOutput.logprobs holds one dict per generated token, token id -> Logprob(logprob, rank):
    the `SamplingParams.logprobs` likeliest and the sampled token (tensorrt_llm/executor/result.py compute_logprobs;
    tensorrt_llm/serve/postprocess_handlers.py create_logprobs reads the sampled one as `logprob[token_id]`). The LLM
    is asked for at least one (`logprobs_asked`): some releases score nothing at 0. A token's text is what it adds
    to the output, decoded in context in a short window (vLLM's prefix and read offsets), "" for a token that ends
    inside a multi-byte character (the completing one carries it), so the texts add up to the output's; alternatives
    are decoded on their own. Tokens TensorRT-LLM cuts from `token_ids` (a stop string's) go unscored.
    """

    def __init__(self, tokenizer, num_top: int):
        self.num_top = num_top
        self._decode = functools.partial(tokenizer.decode, skip_special_tokens=True)
        self._alternative_text = functools.lru_cache(maxsize=1 << 16)(lambda token: tokenizer.decode([token]))
        self._ids: list[int] = []  # the tokens scored so far
        self._prefix = self._read = 0  # the window: _ids[_prefix:_read] is decoded text, _ids[_read:] is not yet

    @property
    def logprobs_asked(self) -> int:
        return max(self.num_top, 1)

    def tensors(self, pb, completion) -> list:
        new = len(self._ids)
        rows = list(zip(completion.token_ids[new:], (getattr(completion, "logprobs", None) or [])[new:]))
        if not rows:
            return []
        texts, logprobs, top = [], [], []
        for token, scored in rows:
            if token not in scored or len(scored) < self.num_top:
                raise RuntimeError(
                    f"TensorRT-LLM scored token {token} with {sorted(scored)} (the sampled token and "
                    f"{self.num_top} alternatives wanted)"
                )
            texts.append(self._piece(token).encode("utf-8"))
            logprobs.append(scored[token].logprob)
            top.append(sorted(scored.items(), key=lambda item: -item[1].logprob)[: self.num_top])
        names = [spec.name for spec in contract.SCORE_OUTPUTS]
        columns = [
            np.array(logprobs, dtype=np.float32),
            np.array([t for t, _ in rows], dtype=np.int32),
            np.array(texts, dtype=object),
        ]
        if self.num_top:
            columns += [
                np.array([[lp.logprob for _, lp in row] for row in top], dtype=np.float32),
                np.array([[t for t, _ in row] for row in top], dtype=np.int32),
                np.array([[self._alternative_text(t).encode("utf-8") for t, _ in row] for row in top], dtype=object),
            ]
        return [pb.Tensor(name, column) for name, column in zip(names, columns)]

    def _piece(self, token: int) -> str:
        self._ids.append(token)
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if after.endswith("\ufffd") or len(after) <= len(before):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return after[len(before) :]


def speculative_counters(completion) -> tuple[float, int, int]:
    """(acceptance_rate, total_accepted_draft_tokens, total_draft_tokens) of a request so far; zeros without a
    draft (TensorRT-LLM reports them in request_perf_metrics.speculative_decoding)."""
    metrics = getattr(completion, "request_perf_metrics", None)
    spec = getattr(metrics, "speculative_decoding", None)
    if spec is None:
        return 0.0, 0, 0
    return (
        float(getattr(spec, "acceptance_rate", 0.0) or 0.0),
        int(getattr(spec, "total_accepted_draft_tokens", 0) or 0),
        int(getattr(spec, "total_draft_tokens", 0) or 0),
    )


class RequestGauges:
    """This model's queue on Triton's metrics port, for the autoscaler and the dashboards: requests accepted and not
    finished, split into `waiting` (no output token yet: queued in the LLM or in prefill) and `running`.

    Triton's own series say nothing useful here: `nv_inference_pending_request_count` counts requests waiting for
    `execute`, which a decoupled model returns from at once (so it stays near 0), and the `nv_trt_llm_*` series come
    from the C++ `tensorrtllm` backend, which this model does not use. The gauges are Python-backend custom metrics
    (`pb_utils.MetricFamily`, Triton >= 23.05, exported as named, labelled `model`); helm/tools/engine_metrics.py
    reads them under these names. A backend without MetricFamily gets no gauges, said once at start."""

    WAITING = "deepspec_llmapi_num_requests_waiting"
    RUNNING = "deepspec_llmapi_num_requests_running"

    def __init__(self, pb_utils, model_name: str):
        family = getattr(pb_utils, "MetricFamily", None)
        self.waiting = self.running = None
        if family is None:
            print(
                f"warning: this Triton's Python backend has no MetricFamily: {self.WAITING} and {self.RUNNING} "
                "are not exported, and the chart's autoscaler sees no queue",
                file=sys.stderr,
            )
            return
        labels = {"model": model_name}
        self.waiting = family(
            name=self.WAITING, description="Requests accepted with no output token yet.", kind=family.GAUGE
        ).Metric(labels=labels)
        self.running = family(
            name=self.RUNNING, description="Requests producing output tokens.", kind=family.GAUGE
        ).Metric(labels=labels)

    def _add(self, gauge, value: int) -> None:
        if gauge is not None:
            gauge.increment(value)

    def arrived(self) -> None:
        self._add(self.waiting, 1)

    def started(self) -> None:
        self._add(self.waiting, -1)
        self._add(self.running, 1)

    def finished(self, started: bool) -> None:
        self._add(self.running if started else self.waiting, -1)


def has_output(result) -> bool:
    """Whether a TensorRT-LLM GenerationResult has produced a token (its CompletionOutput grows in place)."""
    outputs = getattr(result, "outputs", None) or ()
    return bool(outputs and getattr(outputs[0], "token_ids", None))


class TritonPythonModel:
    """Triton's Python-backend entry points: initialize, execute (decoupled), finalize."""

    def initialize(self, args: dict) -> None:
        # Triton's backend utilities, TensorRT-LLM and mpi4py exist in the Triton image only, not in the venv
        import triton_python_backend_utils as pb_utils  # pyright: ignore[reportMissingImports]
        from tensorrt_llm._utils import global_mpi_rank, global_mpi_size  # pyright: ignore[reportMissingImports]

        self.pb_utils = pb_utils
        self.llm = self.loop = None
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise ValueError("this model streams: its config.pbtxt needs model_transaction_policy { decoupled: true }")
        model_yaml = Path(args["model_repository"]) / str(args["model_version"]) / "model.yaml"
        self.rank, num_ranks = global_mpi_rank(), global_mpi_size()
        if self.rank != 0:  # a follower: lend this rank to the leader's LLM until it shuts down
            from mpi4py.futures import MPICommExecutor  # pyright: ignore[reportMissingImports]
            from mpi4py.MPI import COMM_WORLD  # pyright: ignore[reportMissingImports]

            with MPICommExecutor(COMM_WORLD) as executor:
                if executor is not None:
                    raise RuntimeError(f"rank {self.rank} of the MPI world must not lead it")
            return
        llm_args = load_llm_args(model_yaml)
        if num_ranks > 1:
            if world_size_of(llm_args) != num_ranks:
                raise ValueError(
                    f"{model_yaml} asks for {world_size_of(llm_args)} ranks (tensor_parallel_size x "
                    f"pipeline_parallel_size), mpirun started {num_ranks}: make them agree"
                )
            from mpi4py.MPI import COMM_WORLD  # pyright: ignore[reportMissingImports]
            from tensorrt_llm.llmapi import MpiCommSession  # pyright: ignore[reportMissingImports]

            llm_args["_mpi_session"] = MpiCommSession(comm=COMM_WORLD, n_workers=COMM_WORLD.Get_size())
        triton_config = read_model_yaml(model_yaml).get("triton_config") or {}
        self.cancellation_check_period_s = (
            float(triton_config.get("cancellation_check_period_ms", DEFAULT_CANCELLATION_CHECK_PERIOD_MS)) / 1000.0
        )
        from tensorrt_llm import LLM, SamplingParams  # pyright: ignore[reportMissingImports]

        self.sampling_params = SamplingParams
        self.gauges = RequestGauges(pb_utils, str(args.get("model_name") or config.get("name") or "tensorrt_llm"))
        self.llm = LLM(**llm_args)
        #: Triton request id -> the LLM results running for it (what a `stop` request aborts)
        self.running: dict[str, set] = {}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="llmapi-loop", daemon=True)
        self.thread.start()

    def execute(self, requests) -> None:
        if self.loop is None:  # initialize returned early: this rank lends itself to the leader's LLM
            raise RuntimeError(f"rank {self.rank} of the MPI world serves no requests; send them to rank 0")
        for request in requests:
            asyncio.run_coroutine_threadsafe(self._serve(request), self.loop)
        return None

    async def _serve(self, request) -> None:
        llm, pb = self.llm, self.pb_utils
        assert llm is not None  # execute serves on rank 0 only, where initialize built the LLM
        sender = request.get_response_sender()
        final = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        request_id = request.request_id()
        cancelled = asyncio.Event()
        watcher = result = None
        progress = {"started": False}
        self.gauges.arrived()
        try:
            if _scalar(pb, request, contract.STOP_REQUEST):
                self._stop(request_id, sender)
                return
            prompt, messages, sampling, streaming = read_request(pb, request)
            num_top = read_num_top_logprobs(pb, request)
            scores = None if num_top is None else OutputScores(llm.tokenizer, num_top)
            if scores is not None:
                sampling["logprobs"] = scores.logprobs_asked
            if messages is not None:
                prompt = llm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
                # the template already wrote BOS (Llama, Mistral): tokenizing it with special tokens adds a second.
                # trtllm-serve's chat path does the same (tensorrt_llm/serve/openai_protocol.py
                # ChatCompletionRequest.add_special_tokens defaults to False)
                sampling["add_special_tokens"] = False
            params = self.sampling_params(**sampling, return_perf_metrics=True)
            result = llm.generate_async(prompt, params, streaming=streaming)
            self.running.setdefault(request_id, set()).add(result)
            watcher = asyncio.ensure_future(self._watch(request, result, cancelled, progress))
            if streaming:
                await self._stream(result, sender, cancelled, scores)
            else:
                out = await result.aresult()
                if not cancelled.is_set():
                    sender.send(self._response(out, out.outputs[0].text, scores), flags=final)
            if cancelled.is_set():
                self._send_cancelled(sender)
        except BadRequest as e:
            sender.send(pb.InferenceResponse(error=pb.TritonError(f"bad request: {e}")), flags=final)
        except Exception as e:
            if cancelled.is_set():
                self._send_cancelled(sender)
            else:
                sender.send(pb.InferenceResponse(error=pb.TritonError(f"{type(e).__name__}: {e}")), flags=final)
        finally:
            self.gauges.finished(progress["started"])
            if watcher is not None:
                watcher.cancel()
            if result is not None:
                self.running.get(request_id, set()).discard(result)
                if not self.running.get(request_id, True):
                    del self.running[request_id]

    async def _stream(self, result, sender, cancelled: asyncio.Event, scores: OutputScores | None) -> None:
        """One response per step, each sent in its own iteration: TensorRT-LLM's GenerationResult is one object
        that every step mutates in place, so a response built from it later would carry a later step's text."""
        final = self.pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        async for out in result:
            if cancelled.is_set():
                return
            sender.send(self._response(out, out.outputs[0].text_diff, scores), flags=final if out.finished else 0)
            if out.finished:
                return
        if not cancelled.is_set():  # the iteration ended without a finished step: close the stream
            sender.send(None, flags=final)

    async def _watch(self, request, result, cancelled: asyncio.Event, progress: dict) -> None:
        """Abort `result` once Triton says its client cancelled the request; move it from waiting to running in the
        gauges once it has produced a token (streaming or not)."""
        while not cancelled.is_set():
            await asyncio.sleep(self.cancellation_check_period_s)
            if not progress["started"] and has_output(result):
                progress["started"] = True
                self.gauges.started()
            if request.is_cancelled():
                cancelled.set()
                result.abort()

    def _stop(self, request_id: str, sender) -> None:
        """A `stop: true` request: abort every generation running under its request id."""
        pb = self.pb_utils
        if not request_id:
            sender.send(
                pb.InferenceResponse(error=pb.TritonError("a stop request needs the request id to stop")),
                flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
            return
        for result in self.running.pop(request_id, set()):
            result.abort()
        self._send_cancelled(sender)

    def _send_cancelled(self, sender) -> None:
        pb = self.pb_utils
        sender.send(
            pb.InferenceResponse(error=pb.TritonError("Request cancelled by client", pb.TritonError.CANCELLED)),
            flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )

    def _response(self, out, text: str, scores: OutputScores | None = None):
        """One response: `text`, the finish reason once finished, the request's counts so far, and with `scores` those
        of the tokens scored since the last response."""
        pb = self.pb_utils
        completion = out.outputs[0]
        # TensorRT-LLM's "cancelled" / "timeout" leave as the contract's "abort" (one set of values on the wire)
        reason = str(completion.finish_reason or "stop")
        finish_reason = contract.TRTLLM_FINISH_REASONS.get(reason, "abort") if out.finished else ""
        rate, accepted, drafted = speculative_counters(completion)
        counts = {
            contract.NUM_INPUT_TOKENS: len(getattr(out, "prompt_token_ids", None) or ()),
            contract.NUM_OUTPUT_TOKENS: len(getattr(completion, "token_ids", None) or ()),
            contract.TOTAL_ACCEPTED_DRAFT_TOKENS: accepted,
            contract.TOTAL_DRAFT_TOKENS: drafted,
        }
        tensors = [
            pb.Tensor(contract.TEXT_OUTPUT, np.array([text.encode("utf-8")], dtype=object)),
            pb.Tensor(contract.FINISH_REASON, np.array([finish_reason.encode("utf-8")], dtype=object)),
            pb.Tensor(contract.ACCEPTANCE_RATE, np.array([rate], dtype=np.float32)),
            *(pb.Tensor(name, np.array([n], dtype=np.int32)) for name, n in counts.items()),
            *(scores.tensors(pb, completion) if scores is not None else ()),
        ]
        return pb.InferenceResponse(output_tensors=tensors)

    def finalize(self) -> None:
        if self.llm is not None:
            self.llm.shutdown()
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
