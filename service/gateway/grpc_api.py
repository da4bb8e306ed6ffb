"""The gateway's public gRPC API (`deepspec.v1.Completions`), with grpc.health.v1 and server reflection.

Same path as HTTP (`Dispatcher`), same validation (each request goes through the HTTP API's pydantic schemas, so
both refuse the same inputs with the same messages), same errors mapped to status codes (`ServiceError.grpc_status`).
A request that is not a valid protobuf is INVALID_ARGUMENT, not grpcio's default UNKNOWN. A cancelled call (client
gone, deadline) cancels the handler, which closes the worker stream and frees the slot; `Abort` does the same for
one of the caller's own request ids. API keys, when configured, are read from the `authorization: Bearer <key>`
metadata. Health reports SERVING for "" and the service name while the gateway is ready. Logprobs come as the
worker scored them (deepspec_protocol/token_scores.py), one `TokenLogprob` per token, ids included where the worker
sends them (an OpenAI-HTTP upstream does not: unset), of the distribution `logprobs_mode` names. A `structured_output`
(kind + spec) is validated as the HTTP API's vLLM-style `structured_outputs` object. With `n`, `Complete` answers
every choice in `choices` (its top-level text, finish_reason and logprobs are choice 0's, what an n = 1 client
reads) and `CompleteStream` names each chunk's choice in `index`; the usage counts the prompt once.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection
from pydantic import ValidationError

from deepspec_protocol.protos.deepspec.v1 import completions_pb2 as pb
from deepspec_protocol.token_scores import TokenScore
from deepspec_protocol.worker import Constraint, RequestStats
from service.gateway.dispatch import new_request_id
from service.gateway.errors import BadRequestError, ServiceError, validation_message
from service.gateway.schemas import ChatCompletionRequest, CompletionRequest
from service.gateway.structured import structured_outputs_field
from service.gateway.validation import check_request_id, check_session_id
from service.gateway.worker_client import GenerationRequest, total_stats

_SERVICE = pb.DESCRIPTOR.services_by_name["Completions"]
SERVICE_NAME = _SERVICE.full_name
#: gRPC's defaults where a field is unset (HTTP's differ: OpenAI's temperature 1, max_tokens 16)
_DEFAULT_MAX_TOKENS = 128
_DEFAULT_TEMPERATURE = 0.0


def _usage(s: RequestStats) -> pb.Usage:
    """The usage of a request's `total_stats`."""
    return pb.Usage(
        prompt_tokens=s.num_prompt_tokens,
        completion_tokens=s.num_output_tokens,
        total_tokens=s.num_prompt_tokens + s.num_output_tokens,
        num_draft_tokens=s.num_draft_tokens,
        num_accepted_tokens=s.num_accepted_tokens,
    )


class _Malformed:
    """What the deserializer hands a handler for bytes that are not a valid message (grpcio would say UNKNOWN)."""

    def __init__(self, name: str, error: Exception):
        self.message = f"the request is not a valid {name} protobuf: {error}"


def _lenient(message_class):
    def parse(data: bytes):
        try:
            return message_class.FromString(data)
        except DecodeError as e:
            return _Malformed(message_class.DESCRIPTOR.full_name, e)

    return parse


def to_generation_request(request: pb.CompletionRequest, model: str) -> GenerationRequest:
    """A CompletionRequest validated by the HTTP API's schemas; BadRequestError with their message otherwise.
    prompt_logprobs is the HTTP API's echo with logprobs; top_logprobs counts the alternatives of both tables."""
    if sum(map(bool, (request.prompt, request.prompt_token_ids, request.messages))) != 1:
        raise BadRequestError("send exactly one of prompt, prompt_token_ids or messages", param="prompt")
    if request.HasField("top_logprobs") and not (request.logprobs or request.prompt_logprobs):
        raise BadRequestError("top_logprobs needs logprobs or prompt_logprobs", param="top_logprobs")
    if request.prompt_logprobs and request.messages:
        raise BadRequestError(
            "prompt_logprobs scores a prompt: send prompt or prompt_token_ids", param="prompt_logprobs"
        )
    request_id = check_request_id(request.request_id) if request.request_id else new_request_id("grpc")
    num_top = request.top_logprobs if request.HasField("top_logprobs") else 0
    fields = {
        "model": request.model or None,
        "stop": list(request.stop) or None,
        "ignore_eos": request.ignore_eos,
        "user": request.user or None,
        "max_tokens": request.max_tokens if request.HasField("max_tokens") else _DEFAULT_MAX_TOKENS,
        "temperature": request.temperature if request.HasField("temperature") else _DEFAULT_TEMPERATURE,
        **{
            name: getattr(request, name)
            for name in ("top_p", "top_k", "seed", "n", "logprobs_mode")
            if request.HasField(name)
        },
    }
    if request.HasField("structured_output"):
        fields["structured_outputs"] = _structured_outputs(request.structured_output)
    if request.HasField("speculation"):
        fields["speculation"] = {
            "mode": request.speculation.mode or "auto",
            **(
                {"max_draft_tokens": request.speculation.max_draft_tokens}
                if request.speculation.HasField("max_draft_tokens")
                else {}
            ),
        }
    try:
        if request.messages:
            messages = [{"role": m.role, "content": m.content} for m in request.messages]
            body = ChatCompletionRequest.model_validate(
                {
                    **fields,
                    "messages": messages,
                    "logprobs": request.logprobs,
                    "top_logprobs": num_top if request.logprobs else None,
                }
            )
            return GenerationRequest(request_id=request_id, model=model, **body.generation())
        body = CompletionRequest.model_validate(
            {
                **fields,
                "prompt": request.prompt or list(request.prompt_token_ids),
                "echo": request.prompt_logprobs,
                "logprobs": num_top if request.logprobs or request.prompt_logprobs else None,
            }
        )
        generation = body.generation(body.prompts[0])
        if not request.logprobs:  # the prompt's scores only
            generation["logprobs"] = None
        return GenerationRequest(request_id=request_id, model=model, **generation)
    except ValidationError as e:
        message, param = validation_message(e.errors())
        raise BadRequestError(message, param=param) from None


def _structured_outputs(message: pb.StructuredOutput) -> dict:
    """The message as the HTTP API's `structured_outputs` (vLLM's object), so both APIs validate it alike."""
    try:
        return structured_outputs_field(Constraint(message.kind, message.spec))
    except ValueError as e:
        raise BadRequestError(f"structured_output: {e}", param="structured_output") from None


def _token_id(token_id: int) -> int | None:
    """A token id as the API sends it: unset (None) where the worker did not say (-1: an OpenAI-HTTP upstream)."""
    return token_id if token_id >= 0 else None


def _token_logprobs(scores: list[TokenScore] | None) -> list[pb.TokenLogprob]:
    return [
        pb.TokenLogprob(
            token=s.token,
            token_id=_token_id(s.token_id),
            logprob=s.logprob,
            top_logprobs=[
                pb.TopLogprob(token=t, token_id=_token_id(i), logprob=lp)
                for t, i, lp in zip(s.top_tokens, s.top_token_ids, s.top_logprobs)
            ],
        )
        for s in scores or ()
    ]


class CompletionsServicer:
    def __init__(self, state):
        self.state = state

    def _caller(self, context) -> str | None:
        return self.state.check_api_key(dict(context.invocation_metadata() or ()).get("authorization"))

    def _start(self, request, context) -> tuple[GenerationRequest, str | None]:
        """(the worker request, the caller); a ServiceError for a bad key, model or input."""
        caller = self._caller(context)
        if isinstance(request, _Malformed):
            raise BadRequestError(request.message)
        model, _ = self.state.dispatcher.resolve_model(request.model)
        req = to_generation_request(request, model)
        if request.session_id:
            req.session = check_session_id(request.session_id)
        return req, caller

    async def Complete(self, request, context):
        try:
            req, caller = self._start(request, context)
            results = await self.state.dispatcher.complete(req, "grpc", caller=caller)
        except ServiceError as e:
            await context.abort(e.grpc_status, e.message)
        choices = [
            pb.Choice(
                index=r.index, text=r.text, finish_reason=r.finish_reason or "", logprobs=_token_logprobs(r.logprobs)
            )
            for r in results
        ]
        prompt_scores = next((r.prompt_logprobs for r in results if r.prompt_logprobs is not None), None)
        return pb.CompletionResponse(
            id=req.request_id,
            model=req.model,
            text=choices[0].text,
            finish_reason=choices[0].finish_reason,
            logprobs=choices[0].logprobs,
            usage=_usage(total_stats(r.stats for r in results)),
            prompt_logprobs=_token_logprobs(prompt_scores),
            choices=choices,
        )

    async def CompleteStream(self, request, context):
        try:
            req, caller = self._start(request, context)
            latest = {}  # choice -> its counts so far
            async for chunk in self.state.dispatcher.generate(req, "grpc", caller=caller):
                latest[chunk.index] = chunk.stats
                out = pb.CompletionChunk(
                    id=req.request_id,
                    text=chunk.text,
                    index=chunk.index,
                    finish_reason=chunk.finish_reason or "",
                    logprobs=_token_logprobs(chunk.logprobs),
                    prompt_logprobs=_token_logprobs(chunk.prompt_logprobs),
                )
                if chunk.final:
                    out.usage.CopyFrom(_usage(total_stats(latest.values())))
                yield out
        except ServiceError as e:
            await context.abort(e.grpc_status, e.message)

    async def Abort(self, request: pb.AbortRequest | _Malformed, context: grpc.aio.ServicerContext):
        """Cancel one of the caller's own running requests; `found` is false for anyone else's."""
        try:
            caller = self._caller(context)
            if isinstance(request, _Malformed):
                raise BadRequestError(request.message)
        except ServiceError as e:
            await context.abort(e.grpc_status, e.message)
        return pb.AbortResponse(found=self.state.dispatcher.abort(request.request_id, caller))


def _method_handlers(servicer: CompletionsServicer) -> dict[str, grpc.RpcMethodHandler]:
    """The generated `add_CompletionsServicer_to_server`, but with `_lenient` request parsing."""
    handlers = {}
    for method in _SERVICE.methods:
        request_class, response_class = getattr(pb, method.input_type.name), getattr(pb, method.output_type.name)
        make = grpc.unary_stream_rpc_method_handler if method.server_streaming else grpc.unary_unary_rpc_method_handler
        handlers[method.name] = make(
            getattr(servicer, method.name),
            request_deserializer=_lenient(request_class),
            response_serializer=response_class.SerializeToString,
        )
    return handlers


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
    handlers = _method_handlers(CompletionsServicer(state))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    # grpcio (1.85 here) has it; the grpcio stubs bundled with pyright predate it
    server.add_registered_method_handlers(SERVICE_NAME, handlers)  # pyright: ignore[reportAttributeAccessIssue]
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
