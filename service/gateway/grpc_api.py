"""The gateway's public gRPC API (`deepspec.v1.Completions`), with grpc.health.v1 and server reflection.

Same path as HTTP (`Dispatcher`), same errors mapped to status codes (`ServiceError.grpc_status`). A cancelled call
(client gone, deadline) cancels the handler, which closes the worker stream and frees the slot; `Abort` does the
same for a request id. API keys, when configured, are read from the `authorization: Bearer <key>` metadata.
Health reports SERVING for "" and the service name while the gateway is ready.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from service.gateway.dispatch import new_request_id
from service.gateway.errors import BadRequestError, ServiceError
from service.gateway.worker_client import Chunk, GenerationRequest
from service.protos.deepspec.v1 import completions_pb2 as pb
from service.protos.deepspec.v1 import completions_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Completions"].full_name
_MAX_INT32 = 2**31 - 1


def _usage(chunk: Chunk) -> pb.Usage:
    return pb.Usage(prompt_tokens=chunk.num_prompt_tokens, completion_tokens=chunk.num_output_tokens,
                    total_tokens=chunk.num_prompt_tokens + chunk.num_output_tokens,
                    num_draft_tokens=chunk.num_draft_tokens, num_accepted_tokens=chunk.num_accepted_tokens)  # fmt: skip


class CompletionsServicer(pb_grpc.CompletionsServicer):
    def __init__(self, state):
        self.state = state

    def _request(self, request: pb.CompletionRequest, context) -> GenerationRequest:
        metadata = dict(context.invocation_metadata() or ())
        self.state.check_api_key(metadata.get("authorization"))
        model, _ = self.state.dispatcher.resolve_model(request.model)
        if bool(request.prompt) == bool(request.messages):
            raise BadRequestError("send exactly one of prompt or messages", param="prompt")
        max_tokens = request.max_tokens if request.HasField("max_tokens") else 128
        if not 1 <= max_tokens <= _MAX_INT32:
            raise BadRequestError(f"max_tokens must be in [1, {_MAX_INT32}], got {max_tokens}", param="max_tokens")
        temperature = request.temperature if request.HasField("temperature") else 0.0
        top_p = request.top_p if request.HasField("top_p") else 1.0
        if temperature < 0 or not 0 < top_p <= 1:
            raise BadRequestError("temperature must be >= 0 and top_p in (0, 1]", param="temperature")
        if any(not m.role or m.role not in ("system", "developer", "user", "assistant") for m in request.messages):
            raise BadRequestError("message roles are system, developer, user or assistant", param="messages")
        return GenerationRequest(
            request_id=request.request_id or new_request_id("grpc"), model=model, prompt=request.prompt or None,
            messages=[{"role": m.role, "content": m.content} for m in request.messages] or None,
            max_tokens=max_tokens, temperature=temperature, top_p=top_p,
            top_k=min(request.top_k, _MAX_INT32) if request.HasField("top_k") else 0,
            seed=request.seed if request.HasField("seed") else None, stop=list(request.stop),
            ignore_eos=request.ignore_eos,
        )  # fmt: skip

    async def Complete(self, request, context):
        try:
            req = self._request(request, context)
            text, last = await self.state.dispatcher.complete(req, "grpc")
        except ServiceError as e:
            await context.abort(e.grpc_status, e.message)
        return pb.CompletionResponse(id=req.request_id, model=req.model, text=text,
                                     finish_reason=last.finish_reason or "", usage=_usage(last))  # fmt: skip

    async def CompleteStream(self, request, context):
        try:
            req = self._request(request, context)
            async for chunk in self.state.dispatcher.generate(req, "grpc"):
                out = pb.CompletionChunk(id=req.request_id, text=chunk.text)
                if chunk.final:
                    out.finish_reason = chunk.finish_reason or ""
                    out.usage.CopyFrom(_usage(chunk))
                yield out
        except ServiceError as e:
            await context.abort(e.grpc_status, e.message)

    async def Abort(self, request, context):
        self.state.check_api_key(dict(context.invocation_metadata() or ()).get("authorization"))
        return pb.AbortResponse(found=self.state.dispatcher.abort(request.request_id))


class GrpcGateway:
    def __init__(self, server: grpc.aio.Server, health: HealthServicer, state):
        self.server, self.health, self.state = server, health, state
        self._sync = asyncio.create_task(self._sync_health())

    async def _sync_health(self) -> None:
        serving = None
        while True:
            now = self.state.dispatcher.ready
            if now != serving:
                status = health_pb2.HealthCheckResponse.SERVING if now else health_pb2.HealthCheckResponse.NOT_SERVING
                for name in ("", SERVICE_NAME):
                    await self.health.set(name, status)
                serving = now
            await asyncio.sleep(0.5)

    async def set_not_serving(self) -> None:
        self._sync.cancel()
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)

    async def stop(self, grace_s: float) -> None:
        self._sync.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._sync
        await self.server.stop(grace_s)


async def start_grpc_server(state, host: str, port: int) -> tuple[GrpcGateway, int]:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    pb_grpc.add_CompletionsServicer_to_server(CompletionsServicer(state), server)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server
    )
    try:  # grpcio raises on a taken port, older releases returned 0
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise RuntimeError(f"cannot bind the gateway's gRPC port {host}:{port}")
    await server.start()
    return GrpcGateway(server, health, state), bound
