"""One worker, seen from the gateway: a shared gRPC channel and the KServe v2 stubs that ship in tritonclient.

Streaming requests go through `ModelStreamInfer`, so the gateway sees the first token (retry is only allowed before
it), measures TTFT and inter-chunk latency itself, and cancels the worker's sequence by cancelling the call.
Non-streaming requests use one unary `ModelInfer` (cheaper; the worker's own histograms time them). A gRPC deadline
bounds each call. Tensors are encoded and decoded by `service.tensors`, the codec the worker uses too. Errors
surface as `WorkerError(status, message)` with `status` a grpc.StatusCode name, whether they came as a stream
`error_message` or as an RPC status.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from service import protocol as p
from service import tensors

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
    """What the gateway asks a worker for; either `prompt` (raw text) or `messages` (chat, rendered by the worker)."""

    request_id: str
    model: str
    prompt: str | None = None
    messages: list[dict] | None = None
    #: None = as many as fit in the context
    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False


@dataclass
class Chunk:
    """One worker response: new text plus the request's cumulative counts."""

    text: str
    stats: p.RequestStats = field(default_factory=p.RequestStats)
    finish_reason: str | None = None
    final: bool = False


class WorkerError(Exception):
    """A failed worker call: `status` a grpc.StatusCode name; `code` the engine's error code (service/protocol.py
    ERROR_CODES) when the worker refused the request's content, else None."""

    def __init__(self, status: str, message: str, code: str | None = None):
        super().__init__(f"{status}: {message}")
        self.status, self.message, self.code = status, message, code


def build_infer_request(req: GenerationRequest, stream: bool = True) -> service_pb2.ModelInferRequest:
    """The TensorRT-LLM ensemble's inputs, as raw [1, 1] tensors (stop_words [1, n])."""
    request = service_pb2.ModelInferRequest(model_name=req.model, id=req.request_id)
    add = tensors.add_input
    add(request, p.TEXT_INPUT, "BYTES", [req.prompt or ""])
    if req.messages is not None:
        add(request, p.EXTRA_MESSAGES_JSON, "BYTES", [json.dumps(req.messages, ensure_ascii=False)])
    if req.max_tokens is not None:
        add(request, p.MAX_TOKENS, "INT32", [req.max_tokens])
    add(request, p.STREAM, "BOOL", [stream])
    add(request, p.TEMPERATURE, "FP32", [req.temperature])
    add(request, p.TOP_P, "FP32", [req.top_p])
    add(request, p.TOP_K, "INT32", [req.top_k])
    if req.seed is not None:
        add(request, p.SEED, "UINT64", [req.seed])
    if req.stop:
        add(request, p.STOP_WORDS, "BYTES", req.stop)
    if req.ignore_eos:
        add(request, p.EXTRA_IGNORE_EOS, "BOOL", [True])
    return request


def parse_response(response: service_pb2.ModelInferResponse) -> Chunk:
    """A worker response as a Chunk; `tensors.TensorError` when it is malformed. Outputs a stock Triton does not
    send count as 0."""
    values = tensors.read_outputs(response)
    text = values.get(p.TEXT_OUTPUT) or [b""]
    final = response.parameters[p.FINAL_RESPONSE_PARAM].bool_param if p.FINAL_RESPONSE_PARAM in response.parameters else False

    stats = p.RequestStats(**{field: tensors.scalar(values, name, int, 0) for field, name in p.STATS_OUTPUTS.items()})
    return Chunk(text=text[0].decode("utf-8", "replace"), stats=stats,
                 finish_reason=tensors.scalar(values, p.EXTRA_FINISH_REASON, str) or None, final=final)  # fmt: skip


def _stream_error_code(response: service_pb2.ModelInferResponse) -> str | None:
    if p.ERROR_CODE_PARAM not in response.parameters:  # a stock Triton, or a refusal without a code
        return None
    return response.parameters[p.ERROR_CODE_PARAM].string_param or None


def _rpc_error(e: grpc.aio.AioRpcError) -> WorkerError:
    code = dict(e.trailing_metadata() or ()).get(p.ERROR_CODE_METADATA)
    return WorkerError(e.code().name, e.details() or e.code().name, code if isinstance(code, str) else None)


class WorkerClient:
    def __init__(self, address: str):
        self.address = address
        self.channel = grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS)
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)

    async def is_ready(self, timeout_s: float) -> bool:
        response = await self.stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=timeout_s)
        return response.ready

    async def model_info(self, timeout_s: float) -> dict[str, int]:
        """Ready models served by this worker -> their context length (0 if the worker does not say)."""
        index = await self.stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True), timeout=timeout_s)
        models = {}
        for model in index.models:
            if model.state and model.state != "READY":
                continue
            max_seq_len = 0
            try:
                config = await self.stub.ModelConfig(service_pb2.ModelConfigRequest(name=model.name), timeout=timeout_s)
                max_seq_len = int(config.config.parameters[p.MAX_SEQ_LEN_PARAM].string_value or 0)
            except (grpc.RpcError, ValueError, KeyError):
                pass
            models[model.name] = max_seq_len
        return models

    async def generate(self, req: GenerationRequest, timeout_s: float) -> AsyncIterator[Chunk]:
        """Stream one request; closing the iterator (or cancelling its task) cancels the call and the sequence."""
        call = self.stub.ModelStreamInfer(iter([build_infer_request(req)]), timeout=timeout_s)
        try:
            async for response in call:
                if response.error_message:
                    status, message = p.decode_stream_error(response.error_message)
                    raise WorkerError(status, message, _stream_error_code(response.infer_response))
                chunk = parse_response(response.infer_response)
                yield chunk
                if chunk.final:
                    return
            raise WorkerError("UNAVAILABLE", "the worker closed the stream before the final response")
        except grpc.aio.AioRpcError as e:
            raise _rpc_error(e) from None
        finally:
            call.cancel()

    async def infer(self, req: GenerationRequest, timeout_s: float) -> AsyncIterator[Chunk]:
        """Non-streaming requests: one unary ModelInfer (cheaper than a stream), yielded as a single final chunk."""
        try:
            response = await self.stub.ModelInfer(build_infer_request(req, stream=False), timeout=timeout_s)
        except grpc.aio.AioRpcError as e:
            raise _rpc_error(e) from None
        chunk = parse_response(response)
        chunk.final = True
        yield chunk

    async def close(self) -> None:
        await self.channel.close()
