"""The worker: one engine behind the KServe v2 gRPC protocol (the servicer and stubs that ship in tritonclient).

`WorkerService` owns the lifecycle: the gRPC server answers ServerLive at once, loads weights in a thread, runs one
warm-up step, and only then turns ServerReady / ModelReady / grpc.health.v1 to SERVING. `drain()` turns readiness
false first, refuses new requests with UNAVAILABLE (the gateway retries elsewhere), waits for in-flight requests,
then stops. Tensor names and conventions: `service/protocol.py`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from tritonclient.grpc import service_pb2_grpc

from deepspec.decoding.params import SamplingParams, StepOutput
from deepspec.decoding.structured import StructuredOutput
from deepspec.decoding.validation import RequestError, RequestErrorCode
from deepspec_protocol import tensors
from deepspec_protocol import worker as p
from deepspec_protocol.token_scores import TokenScore, add_scores
from service import tracing
from service.kserve_messages import ModelInferResponse, model_config_pb2, scalar, service_pb2
from service.metrics import WorkerMetrics, start_metrics_server
from service.worker.engine import LoadedEngine, load_engine
from service.worker.scheduler import QueueFullError, Scheduler, SchedulerClosedError
from service.worker.settings import WorkerSettings
from service.worker.token_texts import OutputScores, alternative_texts, prompt_scores

logger = logging.getLogger(__name__)

_SERVER_NAME = "deepspec-worker"
#: prompts longer than this are tokenized off the event loop
_TOKENIZE_INLINE_MAX_CHARS = 4096


class WorkerRefusal(Exception):
    """A refusal decided by the worker itself (not ready, unknown model, unreadable tensors): a status, no code."""

    def __init__(self, status: grpc.StatusCode, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, service: WorkerService):
        self.service = service

    # -- health and metadata --------------------------------------------------------------------------------------

    async def ServerLive(self, request, context):
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return service_pb2.ServerReadyResponse(ready=self.service.ready)

    async def ModelReady(self, request, context):
        return service_pb2.ModelReadyResponse(ready=self.service.ready and request.name == self.service.model_name)

    async def ServerMetadata(self, request, context):
        return service_pb2.ServerMetadataResponse(name=_SERVER_NAME, version="1", extensions=["streaming"])

    async def RepositoryIndex(self, request, context):
        state = "READY" if self.service.ready else "LOADING"
        return service_pb2.RepositoryIndexResponse(
            models=[
                service_pb2.RepositoryIndexResponse.ModelIndex(name=self.service.model_name, version="1", state=state)
            ]
        )

    async def ModelMetadata(self, request, context):
        await self._check_model(request.name, context)
        t = service_pb2.ModelMetadataResponse.TensorMetadata
        return service_pb2.ModelMetadataResponse(
            name=self.service.model_name,
            versions=["1"],
            platform=p.WORKER_PLATFORM,
            inputs=[t(name=n, datatype=d, shape=s) for n, d, s in _INPUTS],
            outputs=[t(name=n, datatype=d, shape=s) for n, d, s in _OUTPUTS],
        )

    async def ModelConfig(self, request, context):
        await self._check_model(request.name, context)
        mc = model_config_pb2
        config = mc.ModelConfig(
            name=self.service.model_name,
            platform=p.WORKER_PLATFORM,
            max_batch_size=0,
            model_transaction_policy=mc.ModelTransactionPolicy(decoupled=True),
            input=[
                mc.ModelInput(name=n, data_type=_DTYPE[d], dims=s, optional=n != p.TEXT_INPUT) for n, d, s in _INPUTS
            ],
            output=[mc.ModelOutput(name=n, data_type=_DTYPE[d], dims=s) for n, d, s in _OUTPUTS],
        )
        config.parameters[p.MAX_SEQ_LEN_PARAM].string_value = str(
            self.service.loaded.max_seq_len if self.service.loaded else 0
        )
        config.parameters[p.DRAFTER_PARAM].string_value = (
            self.service.loaded.drafter_name if self.service.loaded else ""
        )
        return service_pb2.ModelConfigResponse(config=config)

    async def _check_model(self, name: str, context) -> None:
        if name != self.service.model_name:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"unknown model {name!r}; served: [{self.service.model_name!r}]"
            )

    # -- inference ------------------------------------------------------------------------------------------------

    async def ModelInfer(self, request, context):
        arrival = time.perf_counter()
        self.service.active_rpcs += 1
        try:
            prompt_ids, params, stream, n, service_class = await self.service.parse(request)
            if stream:
                raise WorkerRefusal(grpc.StatusCode.INVALID_ARGUMENT, "stream=true needs ModelStreamInfer")
            if n > 1:
                raise WorkerRefusal(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{p.NUM_RETURN_SEQUENCES}={n} needs "
                    "ModelStreamInfer (one response per sequence; ModelInfer answers one)",
                )
            with tracing.server_span(DECODE_SPAN, context.invocation_metadata(), _span_attributes(request, False)):
                async for whole in self._responses(request, prompt_ids, params, False, arrival, 1, service_class):
                    response = whole  # one response, the whole completion
        except Exception as e:
            status, message, error_code = _status_of(e)
            if error_code is not None:
                context.set_trailing_metadata(((p.ERROR_CODE_METADATA, error_code),))
            await context.abort(status, message)
        finally:
            self.service.active_rpcs -= 1
        return response

    async def ModelStreamInfer(self, request_iterator, context):
        """Decoupled streaming: any number of requests per stream, each answered by one response per step."""
        responses: asyncio.Queue = asyncio.Queue()
        tasks: set[asyncio.Task] = set()
        metadata = context.invocation_metadata()  # a caller's W3C trace context, for each request's span
        self.service.active_rpcs += 1

        async def read_requests():
            async for request in request_iterator:
                task = asyncio.create_task(self._stream_one(request, responses, metadata))
                tasks.add(task)
                task.add_done_callback(lambda t: (tasks.discard(t), responses.put_nowait(None)))

        reader = asyncio.create_task(read_requests())
        try:
            while True:
                # The stream ends when the client half-closed and every request finished.
                if reader.done() and not tasks and responses.empty():
                    break
                getter = asyncio.ensure_future(responses.get())
                await asyncio.wait(
                    {getter, reader} if not reader.done() else {getter}, return_when=asyncio.FIRST_COMPLETED
                )
                if not getter.done():
                    getter.cancel()
                    continue
                item = getter.result()
                if item is not None:
                    yield item
            error = reader.exception()
            if error is not None and not isinstance(error, asyncio.CancelledError):
                raise error
        finally:  # client cancelled or stream failed: abort everything still running (frees the slots)
            self.service.active_rpcs -= 1
            reader.cancel()
            for task in list(tasks):
                task.cancel()

    async def _responses(
        self,
        request,
        prompt_ids: list[int],
        params: SamplingParams,
        stream: bool,
        arrival: float,
        n: int,
        service_class: str,
    ) -> AsyncIterator[ModelInferResponse]:
        """One request's responses, each for one of its n sequences: one per engine step when streaming (its new
        text and the scores of the tokens that text carries, the prompt's in the request's first), else one per
        sequence with everything, when it finishes. The request's last response is the final one."""
        loaded, scheduler, token_text = self.service.loaded, self.service.scheduler, self.service.token_text
        # parse() admitted the request, which it does only once load() has set all three
        assert loaded is not None and scheduler is not None and token_text is not None
        scores = [
            OutputScores(loaded.target.decode, token_text) if params.logprobs is not None else None for _ in range(n)
        ]
        texts, scored = [[] for _ in range(n)], [[] for _ in range(n)]
        prompt, prompt_sent, unfinished, first = None, False, n, True
        async for out, stats, index in scheduler.generate(prompt_ids, params, arrival, n, service_class):
            sequence_scores = scores[index]
            step_scores = sequence_scores.step(out) if sequence_scores is not None else None
            unfinished -= out.finished
            if out.prompt_logprobs is not None and not prompt_sent:  # every sequence has them: send them once
                prompt_sent = True
                prompt = prompt_scores(prompt_ids, out.prompt_logprobs, loaded.target.decode, token_text)
            load = scheduler.load.snapshot() if first or out.finished else None
            first = False
            if stream:
                yield _response(request, out.new_text, out, stats, index, not unfinished, step_scores, prompt, load)
                prompt = None
                continue
            texts[index].append(out.new_text)
            scored[index].extend(step_scores or ())
            if out.finished:
                yield _response(
                    request, "".join(texts[index]), out, stats, index, not unfinished, scored[index], prompt, load
                )
                prompt = None

    async def _stream_one(self, request, responses: asyncio.Queue, metadata=None) -> None:
        arrival = time.perf_counter()
        try:
            prompt_ids, params, stream, n, service_class = await self.service.parse(request)
            with tracing.server_span(DECODE_SPAN, metadata, _span_attributes(request, stream)):
                async for response in self._responses(request, prompt_ids, params, stream, arrival, n, service_class):
                    responses.put_nowait(service_pb2.ModelStreamInferResponse(infer_response=response))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            status, message, error_code = _status_of(e)
            error = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
            if error_code is not None:
                error.parameters[p.ERROR_CODE_PARAM].string_param = error_code
            responses.put_nowait(
                service_pb2.ModelStreamInferResponse(
                    error_message=p.encode_stream_error(status.name, message), infer_response=error
                )
            )


#: the worker's span around one request's decode (tracing.server_span), child of the caller's span
DECODE_SPAN = "deepspec.worker.decode"


def _span_attributes(request, stream: bool) -> dict:
    return {"gen_ai.request.model": request.model_name, "deepspec.request.id": request.id, "deepspec.stream": stream}


def _status_of(e: Exception) -> tuple[grpc.StatusCode, str, str | None]:
    """The one map from a failure to (gRPC status, message, engine error code or None); see service/protocol.py."""
    if isinstance(e, WorkerRefusal):
        return e.status, e.message, None
    if isinstance(e, RequestError):  # the engine's validation: bad input with a typed code
        return grpc.StatusCode.INVALID_ARGUMENT, e.message, e.code.value
    if isinstance(e, ValueError):  # tensors, messages JSON, a target without a chat template
        return grpc.StatusCode.INVALID_ARGUMENT, str(e), None
    if isinstance(e, QueueFullError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(e), None
    if isinstance(e, SchedulerClosedError):
        return grpc.StatusCode.UNAVAILABLE, str(e), None
    logger.exception("request failed")
    return grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}", None


def _response(
    request,
    text: str,
    out: StepOutput,
    stats: p.RequestStats,
    index: int,
    final: bool,
    scores: list[TokenScore] | None = None,
    prompt: list[TokenScore] | None = None,
    load: p.WorkerLoad | None = None,
) -> ModelInferResponse:
    """One response of sequence `index`; `final`: the request's last (every sequence has finished); `load` the
    worker's, on a request's first and last responses (service/protocol.py WorkerLoad)."""
    response = service_pb2.ModelInferResponse(model_name=request.model_name, model_version="1", id=request.id)
    tensors.add_output(response, p.TEXT_OUTPUT, text)
    tensors.add_output(response, p.SEQUENCE_INDEX, index)
    for field_name, tensor_name in p.STATS_OUTPUTS.items():
        tensors.add_output(response, tensor_name, getattr(stats, field_name))
    if out.finished:
        tensors.add_output(response, p.EXTRA_FINISH_REASON, out.finish_reason or "stop")
    add_scores(response, p.OUTPUT_SCORES, scores or [])
    add_scores(response, p.PROMPT_SCORES, prompt or [])
    tensors.set_bool_param(response, p.FINAL_RESPONSE_PARAM, final)
    for name, value in load.to_params().items() if load is not None else ():
        if isinstance(value, str):
            response.parameters[name].string_param = value
        elif isinstance(value, int):
            response.parameters[name].int64_param = value
        else:
            response.parameters[name].double_param = value
    return response


_INPUTS = [
    (p.TEXT_INPUT, "BYTES", [1, 1]),
    (p.MAX_TOKENS, "INT32", [1, 1]),
    (p.STREAM, "BOOL", [1, 1]),
    (p.TEMPERATURE, "FP32", [1, 1]),
    (p.TOP_K, "INT32", [1, 1]),
    (p.TOP_P, "FP32", [1, 1]),
    (p.SEED, "UINT64", [1, 1]),
    (p.STOP_WORDS, "BYTES", [1, -1]),
    (p.END_ID, "INT32", [1, 1]),
    (p.EXTRA_MESSAGES_JSON, "BYTES", [1, 1]),
    (p.EXTRA_IGNORE_EOS, "BOOL", [1, 1]),
    (p.INPUT_IDS, "INT32", [1, -1]),
    (p.RETURN_LOG_PROBS, "BOOL", [1, 1]),
    (p.EXTRA_TOP_LOGPROBS, "INT32", [1, 1]),
    (p.EXTRA_PROMPT_LOGPROBS, "INT32", [1, 1]),
    (p.EXTRA_STRUCTURED_OUTPUT, "BYTES", [1, 1]),
    (p.NUM_RETURN_SEQUENCES, "INT32", [1, 1]),
    (p.EXTRA_LOGPROBS_MODE, "BYTES", [1, 1]),
    (p.EXTRA_MAX_DRAFT_TOKENS, "INT32", [1, 1]),
    (p.EXTRA_SERVICE_CLASS, "BYTES", [1, 1]),
    (p.EXTRA_SESSION, "BYTES", [1, 1]),
]
_OUTPUTS = [
    (p.TEXT_OUTPUT, "BYTES", [1, 1]),
    (p.NUM_DRAFT_TOKENS, "INT32", [1, 1]),
    (p.NUM_ACCEPTED_TOKENS, "INT32", [1, 1]),
    (p.EXTRA_NUM_PROMPT_TOKENS, "INT32", [1, 1]),
    (p.EXTRA_NUM_OUTPUT_TOKENS, "INT32", [1, 1]),
    (p.EXTRA_NUM_SPEC_STEPS, "INT32", [1, 1]),
    (p.EXTRA_FINISH_REASON, "BYTES", [1, 1]),
    (p.SEQUENCE_INDEX, "INT32", [1, 1]),
    # the scored-token tables (service/protocol.py ScoreTensors): three [1, n] columns, then three [n, k] ones
    *(
        (name, datatype, [1, -1] if column < 3 else [-1, -1])
        for table in (p.OUTPUT_SCORES, p.PROMPT_SCORES)
        for column, (name, datatype) in enumerate(zip(table.names(), ("FP32", "INT32", "BYTES") * 2))
    ),
]
_DTYPE = {
    "BYTES": model_config_pb2.TYPE_STRING,
    "INT32": model_config_pb2.TYPE_INT32,
    "BOOL": model_config_pb2.TYPE_BOOL,
    "FP32": model_config_pb2.TYPE_FP32,
    "UINT64": model_config_pb2.TYPE_UINT64,
}


class WorkerService:
    """One engine, its scheduler, the KServe v2 + health gRPC server and the /metrics HTTP server."""

    def __init__(self, settings: WorkerSettings, loaded: LoadedEngine | None = None):
        self.settings = settings
        self.loaded = loaded
        self.ready = False
        self.scheduler: Scheduler | None = None
        self.metrics: WorkerMetrics | None = None
        self.model_name = ""
        self.port = settings.port
        self.metrics_port: int | None = None
        self._server: grpc.aio.Server | None = None
        self._health = HealthServicer()
        self._metrics_server = None
        #: token id -> its text on its own: the alternatives' texts (service/worker/token_texts.py)
        self.token_text = None
        #: inference RPCs in progress (ModelInfer, ModelStreamInfer): a drain waits for them as for the scheduler
        self.active_rpcs = 0

    async def start(self) -> None:
        """Serve at once (ServerLive); load, warm up, then turn ready. Returns when ready."""
        await self.bind()
        await self.load()

    async def bind(self) -> None:
        """Start the gRPC server (live, not ready); `self.port` is the bound port afterwards."""
        if not tracing.enabled():  # DEEPSPEC_TRACING (an embedding process may have configured it already)
            tracing.configure("deepspec-worker")
        self._server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(self), self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        await self._health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        self.port = self._server.add_insecure_port(f"{self.settings.host}:{self.settings.port}")
        if self.port == 0:
            raise RuntimeError(f"cannot bind the worker's gRPC port {self.settings.host}:{self.settings.port}")
        await self._server.start()

    async def load(self) -> None:
        """Load weights (in a thread), start the engine thread, run the warm-up step, turn ready."""
        t0 = time.perf_counter()
        if self.loaded is None:
            self.loaded = await asyncio.to_thread(load_engine, self.settings)
        self.model_name = self.loaded.target.name
        self.token_text = alternative_texts(self.loaded.target)
        self.metrics = WorkerMetrics(self.model_name)
        if self.settings.metrics_port >= 0:
            self._metrics_server = start_metrics_server(
                self.metrics.registry, self.settings.host, self.settings.metrics_port
            )
            self.metrics_port = self._metrics_server.server_port
        self.scheduler = Scheduler(
            self.loaded.engine,
            self.metrics,
            max_queue=self.settings.max_queue,
            max_prefill_tokens_per_step=self.settings.max_prefill_tokens_per_step,
        )
        warmed_up = self.scheduler.start(warmup_prompt_token_ids=self.loaded.target.encode("Hello"))
        await asyncio.to_thread(warmed_up.wait)
        self.ready = True
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        logger.info(
            "worker ready: model %s, drafter %s, gRPC :%d, metrics :%s (%.1f s)",
            self.model_name,
            self.loaded.drafter_name,
            self.port,
            self.metrics_port,
            time.perf_counter() - t0,
        )

    async def parse(self, request) -> tuple[list[int], SamplingParams, bool, int, str]:
        """A ModelInferRequest -> (prompt token ids, sampling params, stream, sequences, service class);
        WorkerRefusal for unreadable input,
        RequestError (from SamplingParams) for out-of-range parameters. The prompt is checked against the context by
        the engine's validation when the scheduler takes the request."""
        if not self.ready or self.loaded is None or self.scheduler is None or not self.scheduler.accepting:
            raise WorkerRefusal(grpc.StatusCode.UNAVAILABLE, "the worker is not ready (loading or shutting down)")
        if request.model_name and request.model_name != self.model_name:
            raise WorkerRefusal(
                grpc.StatusCode.NOT_FOUND, f"unknown model {request.model_name!r}; served: [{self.model_name!r}]"
            )
        try:
            values = tensors.read_inputs(request)
            text = scalar(values, p.TEXT_INPUT, str, "")
            messages_json = scalar(values, p.EXTRA_MESSAGES_JSON, str)
            input_ids = values.get(p.INPUT_IDS)
            if input_ids is not None and (text or messages_json is not None):
                raise ValueError(
                    f"send the prompt once: {p.INPUT_IDS} (token ids) with an empty {p.TEXT_INPUT} and "
                    f"no {p.EXTRA_MESSAGES_JSON}"
                )
            if input_ids is not None and not all(isinstance(t, int) for t in input_ids):
                raise ValueError(f"{p.INPUT_IDS} must be an integer tensor")
            end_id = scalar(values, p.END_ID, int)
            max_tokens = scalar(values, p.MAX_TOKENS, int)
            stream = scalar(values, p.STREAM, bool, False)
            n = scalar(values, p.NUM_RETURN_SEQUENCES, int, 1)
            service_class = _service_class(values)
            target = self.loaded.target
            num_chars = len(text) if messages_json is None else len(messages_json)
            if num_chars > p.max_prompt_chars(self.loaded.max_seq_len):  # before tokenizing, so floods cost nothing
                raise RequestError(
                    RequestErrorCode.CONTEXT_TOO_LONG,
                    f"the prompt has {num_chars} characters, more than this model's maximum context "
                    f"length of {self.loaded.max_seq_len} tokens can hold: shorten the prompt",
                )
            if input_ids is not None:
                prompt_ids = input_ids  # checked against the vocabulary and the context by the engine's validation
            elif messages_json is not None:
                prompt_ids = target.encode_chat(_parse_messages(messages_json))
            elif len(text) > _TOKENIZE_INLINE_MAX_CHARS:
                prompt_ids = await asyncio.to_thread(target.encode, text)
            else:
                prompt_ids = target.encode(text)
            if max_tokens is None:  # absent = as many as fit (vLLM's default for chat)
                max_tokens = max(1, self.loaded.max_seq_len - len(prompt_ids))
            params = SamplingParams(
                max_tokens=max_tokens,
                temperature=scalar(values, p.TEMPERATURE, float, 0.0),
                top_k=scalar(values, p.TOP_K, int, 0),
                top_p=scalar(values, p.TOP_P, float, 1.0),
                seed=scalar(values, p.SEED, int),
                stop=tuple(tensors.strings(values, p.STOP_WORDS)),
                stop_token_ids=() if end_id is None or end_id < 0 else (end_id,),
                ignore_eos=scalar(values, p.EXTRA_IGNORE_EOS, bool, False),
                logprobs=_logprobs(values),
                logprobs_mode=scalar(values, p.EXTRA_LOGPROBS_MODE, str, "raw_logprobs"),
                prompt_logprobs=scalar(values, p.EXTRA_PROMPT_LOGPROBS, int),
                structured=_structured(values),
                max_draft_tokens=scalar(values, p.EXTRA_MAX_DRAFT_TOKENS, int),
                session=scalar(values, p.EXTRA_SESSION, str) or None,
            )
        except RequestError:
            raise
        except ValueError as e:
            raise WorkerRefusal(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        return prompt_ids, params, stream, n, service_class

    async def drain(self, timeout_s: float | None = None) -> None:
        """Readiness false first, refuse new requests, wait for in-flight ones (up to the grace period), stop."""
        timeout_s = self.settings.drain_timeout_s if timeout_s is None else timeout_s
        self.ready = False
        await self._health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        if self.scheduler is not None:
            self.scheduler.accepting = False
            deadline = time.monotonic() + timeout_s
            # the scheduler done is not the responses sent: an RPC still flushing its last ones would be cut by the
            # server's stop ("Cancelling all calls"), a failure mid-stream for the gateway; so both must be done
            while (self.scheduler.num_outstanding or self.active_rpcs) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        await self.stop()

    async def stop(self) -> None:
        self.ready = False
        if self._server is not None:
            await self._server.stop(grace=0.5)
        if self.scheduler is not None:
            await asyncio.to_thread(self.scheduler.stop)
        if self._metrics_server is not None:
            await asyncio.to_thread(self._metrics_server.shutdown)  # waits out serve_forever's poll interval
            self._metrics_server.server_close()


def _logprobs(values: dict[str, list]) -> int | None:
    """SamplingParams.logprobs: top_logprobs alternatives when return_log_probs is set, else None (off)."""
    top = scalar(values, p.EXTRA_TOP_LOGPROBS, int)
    if not scalar(values, p.RETURN_LOG_PROBS, bool, False):
        if top is not None:
            raise ValueError(f"{p.EXTRA_TOP_LOGPROBS} needs {p.RETURN_LOG_PROBS} true")
        return None
    return top or 0


def _service_class(values: dict[str, list]) -> str:
    """The request's service class (absent = the default); ValueError naming the known ones."""
    service_class = scalar(values, p.EXTRA_SERVICE_CLASS, str, p.DEFAULT_SERVICE_CLASS)
    if service_class not in p.SERVICE_CLASSES:
        raise ValueError(
            f"{p.EXTRA_SERVICE_CLASS} must be one of {', '.join(p.SERVICE_CLASSES)}, got {service_class[:64]!r}"
        )
    return service_class


def _structured(values: dict[str, list]) -> StructuredOutput | None:
    """SamplingParams.structured from the structured_output input (service/protocol.py Constraint); a value that is
    not one is the engine's code, structured_output_invalid, like a spec that does not compile."""
    try:
        text = scalar(values, p.EXTRA_STRUCTURED_OUTPUT, str)
        constraint = None if text is None else p.Constraint.decode(text)
    except ValueError as e:  # not one UTF-8 element, or not a Constraint's JSON
        raise RequestError(RequestErrorCode.STRUCTURED_OUTPUT_INVALID, str(e)) from None
    if constraint is None:
        return None
    return StructuredOutput(constraint.kind, constraint.spec)  # RequestError for an unknown kind or a missing spec


def _parse_messages(messages_json: str) -> list[dict]:
    try:
        messages = json.loads(messages_json)
    except json.JSONDecodeError as e:
        raise ValueError(f"messages_json is not valid JSON: {e}") from None
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError('each message must be {"role": str, "content": str}')
    return messages
