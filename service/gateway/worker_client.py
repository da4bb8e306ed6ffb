"""One worker, seen from the gateway: a shared gRPC channel and the KServe v2 stubs that ship in tritonclient.

Each served model's ModelConfig is read once (`service/gateway/signature.py`), and every request is built for it:
only inputs it declares, in its dialect (DeepSpec's worker and Triton's ensemble, or the LLM-API model), shaped as
its dims and batch dimension ask. Streaming requests go through `ModelStreamInfer`, so the gateway sees the first
token (retry is only allowed before it), measures TTFT and inter-chunk latency itself, and cancels the worker's
sequence by cancelling the call. Non-streaming requests use one unary `ModelInfer` where the model allows it
(DeepSpec's worker, a non-decoupled model), and the streaming RPC with streaming off on a decoupled Triton model,
which Triton answers on that RPC only, and for several sequences (`n`), which a unary call cannot answer. Each
response names its sequence (`sequence_index`, `Chunk.index`); the call ends on the response flagged
`triton_final_response`, the request's very last (deepspec_protocol/worker.py, "Several choices"). A gRPC
deadline bounds each call. Tensors are decoded by `deepspec_protocol.tensors`, the codec the worker uses too; the
counts are read under DeepSpec's names or Triton's (`total_draft_tokens`, ...). Errors surface as
`WorkerError(status, message)` with `status` a grpc.StatusCode name, whether they came as a stream `error_message`
or as an RPC status.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass, field, fields

import grpc
from tritonclient.grpc import service_pb2_grpc

from deepspec_protocol import tensors
from deepspec_protocol import triton_contract as c
from deepspec_protocol import worker as p
from deepspec_protocol.token_scores import TokenScore, read_scores
from service import tracing
from service.gateway.signature import DEEPSPEC_WORKER, ModelSignature, SignatureError, build_request
from service.kserve_messages import ModelInferRequest, ModelInferResponse, scalar, service_pb2

_CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]


@dataclass
class GenerationRequest:
    """What the gateway asks a worker for: `prompt` (raw text), `prompt_token_ids` or `messages` (chat, rendered by
    the worker)."""

    request_id: str
    model: str
    prompt: str | None = None
    messages: list[dict] | None = None
    prompt_token_ids: list[int] | None = None
    #: None = as many as fit in the context
    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    #: the generated tokens' logprobs with this many alternatives each; None = off
    logprobs: int | None = None
    #: the prompt's logprobs with this many alternatives each (max_tokens may then be 0); None = off
    prompt_logprobs: int | None = None
    #: the distribution the generated tokens' logprobs are of: "raw_logprobs" (the target's) or "processed_logprobs"
    #: (the one sampled from: temperature, top-k, top-p applied); deepspec_protocol/worker.py LOGPROBS_MODES
    logprobs_mode: str = "raw_logprobs"
    #: the output must match this (a JSON schema, regex, grammar or choice); None = free text
    structured_output: p.Constraint | None = None
    #: sequences (choices) from this prompt, each sampled on its own; their chunks carry their `Chunk.index`
    n: int = 1
    #: draft tokens each verify round may check at most (0 = speculation off); None = the worker's own setting
    max_draft_tokens: int | None = None
    #: the service class the gateway admitted the request under (deepspec_protocol/worker.py SERVICE_CLASSES)
    service_class: str = p.DEFAULT_SERVICE_CLASS
    #: what keeps a conversation on one worker (OpenAI's `user` or the `x-session-id` header); None = no session
    session: str | None = None
    #: the worker's session-memory key (the caller's digest + `session`) when the caller's policy opts in; None = the
    #: worker neither remembers this answer nor drafts from the session's earlier ones
    memory_session: str | None = None

    @property
    def extensions(self) -> frozenset[str]:
        """What this request needs beyond a plain completion, named as a refusal names it (c.FEATURE_OF_ROLE)."""
        wanted = {
            "return_log_probs": self.logprobs,
            "prompt_logprobs": self.prompt_logprobs,
            "logprobs_mode": self.sent_logprobs_mode,
            "prompt_token_ids": self.prompt_token_ids,
            "structured_output": self.structured_output,
            "max_draft_tokens": self.max_draft_tokens,
        }
        return frozenset(c.FEATURE_OF_ROLE[role] for role, value in wanted.items() if value is not None)

    @property
    def sent_logprobs_mode(self) -> str | None:
        """The `logprobs_mode` a worker is sent: None for the default (raw) and where no generated token is scored
        (prompt logprobs are always raw), so only a request that changes something needs a worker that reads it."""
        if self.logprobs is None or self.logprobs_mode == "raw_logprobs":
            return None
        return self.logprobs_mode


@dataclass
class Chunk:
    """One worker response: new text of one sequence plus that sequence's cumulative counts, and the scores of the
    tokens that text carries (and of the prompt, in the first) when the request asked for them."""

    text: str
    stats: p.RequestStats = p.RequestStats()  # frozen: one shared zero for every chunk that carries no counts
    #: the sequence's last chunk says why it ended
    finish_reason: str | None = None
    #: the request's very last chunk, of all its sequences
    final: bool = False
    logprobs: list[TokenScore] | None = None
    prompt_logprobs: list[TokenScore] | None = None
    #: which of the request's sequences (0..n-1) this chunk belongs to: its choice
    index: int = 0
    #: the worker's load when it sent this chunk (a request's first and last carry it; a stock Triton never)
    load: p.WorkerLoad | None = None


class WorkerError(Exception):
    """A failed worker call: `status` a grpc.StatusCode name; `code` the engine's error code
    (deepspec_protocol/worker.py ERROR_CODES) when the worker refused the request's content, else None."""

    def __init__(self, status: str, message: str, code: str | None = None):
        super().__init__(f"{status}: {message}")
        self.status, self.message, self.code = status, message, code


def build_infer_request(
    req: GenerationRequest, stream: bool = True, signature: ModelSignature = DEEPSPEC_WORKER
) -> ModelInferRequest:
    """The request `signature`'s model accepts (default: DeepSpec's worker, [1, n] tensors); `WorkerError`
    INVALID_ARGUMENT when the model cannot take it."""
    try:
        return build_request(req, stream, signature)
    except SignatureError as e:
        raise WorkerError("INVALID_ARGUMENT", str(e)) from None


#: RequestStats field -> the outputs that may carry it: DeepSpec's name first, then Triton's
_STATS_NAMES = {
    field: (name, *alias)
    for field, name in p.STATS_OUTPUTS.items()
    for alias in [
        {
            "num_prompt_tokens": (c.NUM_INPUT_TOKENS,),
            "num_output_tokens": (c.NUM_OUTPUT_TOKENS,),
            "num_draft_tokens": (c.TOTAL_DRAFT_TOKENS,),
            "num_accepted_tokens": (c.TOTAL_ACCEPTED_DRAFT_TOKENS,),
        }.get(field, ())
    ]
}


def _count(values: dict[str, list], names: tuple[str, ...]) -> int:
    for name in names:
        if values.get(name):
            return scalar(values, name, int, 0)
    return 0


def parse_response(response: ModelInferResponse) -> Chunk:
    """A worker response as a Chunk; `tensors.TensorError` when it is malformed. Counts a model does not send read
    as 0."""
    values = tensors.read_outputs(response)
    text = values.get(p.TEXT_OUTPUT) or [b""]
    final = (
        response.parameters[p.FINAL_RESPONSE_PARAM].bool_param
        if p.FINAL_RESPONSE_PARAM in response.parameters
        else False
    )

    stats = p.RequestStats(**{field: _count(values, names) for field, names in _STATS_NAMES.items()})
    return Chunk(
        text=text[0].decode("utf-8", "replace"),
        stats=stats,
        finish_reason=scalar(values, p.EXTRA_FINISH_REASON, str) or None,
        final=final,
        logprobs=read_scores(response, values, p.OUTPUT_SCORES),
        prompt_logprobs=read_scores(response, values, p.PROMPT_SCORES),
        index=scalar(values, p.SEQUENCE_INDEX, int, 0),
        load=_load(response),
    )


def _load(response: ModelInferResponse) -> p.WorkerLoad | None:
    parameters = response.parameters
    if p.LOAD_PARAM_PREFIX + "num_slots" not in parameters:
        return None
    return p.WorkerLoad.from_params(
        {
            name: getattr(value, value.WhichOneof("parameter_choice"))
            for name, value in parameters.items()
            if name.startswith(p.LOAD_PARAM_PREFIX)
        }
    )


def merge_chunks(chunks: list[Chunk]) -> Chunk:
    """Consecutive chunks of one sequence as one: the text and scores joined, the last one's counts and finish."""
    last = chunks[-1] if chunks else Chunk("")
    scored = [c.logprobs for c in chunks if c.logprobs is not None]
    prompt = next((c.prompt_logprobs for c in chunks if c.prompt_logprobs is not None), None)
    return Chunk(
        "".join(c.text for c in chunks),
        last.stats,
        last.finish_reason,
        last.final,
        [s for part in scored for s in part] if scored else None,
        prompt,
        last.index,
    )


def merge_sequences(chunks: list[Chunk]) -> list[Chunk]:
    """A request's chunks, its sequences interleaved, as one merged chunk per sequence, in index order."""
    indices = sorted({c.index for c in chunks})
    return [merge_chunks([c for c in chunks if c.index == index]) for index in indices]


def total_stats(stats: Iterable[p.RequestStats]) -> p.RequestStats:
    """A request's counts from each of its sequences' latest: the prompt once (every sequence carries the same
    prompt count; it was prefilled once), the rest summed over the sequences. The usage and the metrics read this."""
    stats = list(stats)
    if len(stats) == 1:  # one sequence (n = 1, the usual request): its counts are the request's
        return stats[0]
    total = {f.name: sum(getattr(s, f.name) for s in stats) for f in fields(p.RequestStats)}
    total["num_prompt_tokens"] = max((s.num_prompt_tokens for s in stats), default=0)
    return p.RequestStats(**total)


def _stream_error_code(response: ModelInferResponse) -> str | None:
    if p.ERROR_CODE_PARAM not in response.parameters:  # a stock Triton, or a refusal without a code
        return None
    return response.parameters[p.ERROR_CODE_PARAM].string_param or None


def _rpc_error(e: grpc.aio.AioRpcError) -> WorkerError:
    code = dict(e.trailing_metadata() or ()).get(p.ERROR_CODE_METADATA)
    return WorkerError(e.code().name, e.details() or e.code().name, code if isinstance(code, str) else None)


class WorkerClient:
    #: what this client forwards (GenerationRequest.extensions); whether a model serves them is its signature's say
    extensions = frozenset(c.FEATURE_OF_ROLE.values())

    def __init__(self, address: str):
        self.address = address
        self.channel = grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS)
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        #: served model -> what it accepts, from its ModelConfig
        self.signatures: dict[str, ModelSignature] = {}

    async def is_ready(self, timeout_s: float) -> bool:
        response = await self.stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=timeout_s)
        return response.ready

    async def model_info(self, timeout_s: float) -> dict[str, int]:
        """Ready models served by this worker -> their context length (0 if the worker does not say); keeps each
        model's signature for the requests to come."""
        index = await self.stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True), timeout=timeout_s)
        models = {}
        for model in index.models:
            if model.state and model.state != "READY":
                continue
            max_seq_len = 0
            try:
                config = await self.stub.ModelConfig(service_pb2.ModelConfigRequest(name=model.name), timeout=timeout_s)
                self.signatures[model.name] = ModelSignature.from_config(config.config)
                max_seq_len = int(config.config.parameters[p.MAX_SEQ_LEN_PARAM].string_value or 0)
            except (grpc.RpcError, ValueError, KeyError):
                pass
            models[model.name] = max_seq_len
        return models

    async def signature(self, model: str, timeout_s: float) -> ModelSignature:
        """`model`'s signature, read from its ModelConfig the first time; DeepSpec's worker's when the worker has no
        ModelConfig RPC."""
        if model not in self.signatures:
            try:
                config = await self.stub.ModelConfig(service_pb2.ModelConfigRequest(name=model), timeout=timeout_s)
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise _rpc_error(e) from None
                return DEEPSPEC_WORKER
            self.signatures[model] = ModelSignature.from_config(config.config)
        return self.signatures[model]

    async def takes_n(self, model: str, timeout_s: float) -> bool:
        """Whether one request may ask `model` for several sequences (`ModelSignature.takes_n`)."""
        return (await self.signature(model, timeout_s)).takes_n

    async def generate(self, req: GenerationRequest, timeout_s: float) -> AsyncGenerator[Chunk, None]:
        """Stream one request, its sequences' chunks interleaved; closing the iterator (or cancelling its task)
        cancels the call and the sequences."""
        signature = await self.signature(req.model, timeout_s)
        async for chunk in self._stream(
            build_infer_request(req, True, signature), timeout_s, signature.cumulative_text
        ):
            yield chunk

    async def infer(self, req: GenerationRequest, timeout_s: float) -> AsyncGenerator[Chunk, None]:
        """Non-streaming requests, yielded as one whole chunk per sequence, the last one final: one unary ModelInfer
        (cheaper than a stream) for one sequence, else the streaming RPC with streaming off, where the model is
        decoupled (Triton refuses ModelInfer there) or the request asks for several sequences (one response each,
        when it finishes; ModelInfer answers one)."""
        signature = await self.signature(req.model, timeout_s)
        request = build_infer_request(req, False, signature)
        if not signature.unary or req.n > 1:
            chunks = merge_sequences(
                [chunk async for chunk in self._stream(request, timeout_s, signature.cumulative_text)]
            )
        else:
            span, trace_metadata = tracing.client_span("deepspec.worker/ModelInfer", self._span_attributes(req.model))
            try:
                chunks = [parse_response(await self.stub.ModelInfer(request, timeout=timeout_s, **trace_metadata))]
            except grpc.aio.AioRpcError as e:
                tracing.end_span(span, e)
                raise _rpc_error(e) from None
            tracing.end_span(span)
        for chunk in chunks:
            chunk.final = chunk is chunks[-1]
            yield chunk

    async def _stream(
        self, request: ModelInferRequest, timeout_s: float, cumulative_text: bool = False
    ) -> AsyncGenerator[Chunk, None]:
        """The worker's responses as chunks of new text; `cumulative_text` (the stock LLM-API model) says each
        response holds the whole text so far, so only what it adds to the previous one is passed on."""
        span, trace_metadata = tracing.client_span(
            "deepspec.worker/ModelStreamInfer", self._span_attributes(request.model_name)
        )
        call = self.stub.ModelStreamInfer(iter([request]), timeout=timeout_s, **trace_metadata)
        text_so_far: dict[int, str] = {}  # sequence index -> its whole text so far
        error = None
        try:
            async for response in call:
                if response.error_message:
                    status, message = p.decode_stream_error(response.error_message)
                    raise WorkerError(status, message, _stream_error_code(response.infer_response))
                chunk = parse_response(response.infer_response)
                if cumulative_text:  # what was sent cannot be taken back: pass on what lies past it
                    sent = text_so_far.get(chunk.index, "")
                    whole, chunk.text = chunk.text, chunk.text[len(sent) :]
                    text_so_far[chunk.index] = max(sent, whole, key=len)
                yield chunk
                if chunk.final:
                    return
            raise WorkerError("UNAVAILABLE", "the worker closed the stream before the final response")
        except grpc.aio.AioRpcError as e:
            error = _rpc_error(e)
            raise error from None
        except WorkerError as e:
            error = e
            raise
        finally:
            call.cancel()
            tracing.end_span(span, error)

    def _span_attributes(self, model: str) -> dict:
        return {"rpc.system": "grpc", "server.address": self.address, "gen_ai.request.model": model}

    async def close(self) -> None:
        await self.channel.close()
