"""The gateway process: FastAPI app factory, the state it shares with the gRPC API, and the serving lifecycle.

`create_app` only wires routers, error handlers and the app's front (`GatewayApp`: the guard, the generation
routes' fast path, hot_routes.py); the state (metrics, worker pool, dispatcher) is built in `lifespan` unless the
caller passes one in (`serve_gateway` does, to share it with the gRPC server). One process per gateway replica: the
routing state (outstanding counts, health) must be shared by every request, so the gateway scales by replicas behind
a Service, not by uvicorn workers — and Prometheus multiprocess mode is therefore not needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import logging
from dataclasses import dataclass, field

from fastapi import FastAPI
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.types import ASGIApp

from service import tracing
from service.gateway.admission import AdmissionQueue
from service.gateway.dispatch import Dispatcher
from service.gateway.errors import (
    AuthenticationError,
    BadRequestError,
    PayloadTooLargeError,
    error_response,
    install_error_handlers,
)
from service.gateway.hot_routes import HotRoutes
from service.gateway.routers import chat, completions, health, models
from service.gateway.routing import WorkerPool
from service.gateway.service_classes import caller_id
from service.gateway.settings import GatewaySettings
from service.gateway.upstreams import client_for
from service.metrics import GatewayMetrics

logger = logging.getLogger(__name__)

#: seconds the requests cut at the end of the drain get to write their error before the servers stop (within the
#: chart's 15 s of slack past preStop + drain in terminationGracePeriodSeconds)
CUT_GRACE_S = 3.0


@dataclass
class GatewayState:
    settings: GatewaySettings
    metrics: GatewayMetrics
    pool: WorkerPool
    dispatcher: Dispatcher
    api_keys: frozenset[str]
    #: each key (UTF-8) -> the caller identity it stands for: digested once here, not on every request
    _callers: dict[bytes, str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._callers = {key.encode(): caller_id(key) for key in self.api_keys}

    @classmethod
    def build(cls, settings: GatewaySettings) -> GatewayState:
        metrics = GatewayMetrics()
        make_client = functools.partial(
            client_for, default=settings.worker_protocol, openai_max_outstanding=settings.openai_max_outstanding
        )
        pool = WorkerPool(
            settings.workers,
            metrics,
            health_interval_s=settings.health_interval_s,
            unhealthy_threshold=settings.unhealthy_threshold,
            dns_refresh_s=settings.dns_refresh_s,
            k8s_api_url=settings.k8s_api_url,
            make_client=make_client,
            routing=settings.routing,
            load_max_age_s=settings.routing_load_max_age_s,
        )
        classes = settings.load_service_classes()
        reserve = settings.interactive_reserve_per_worker
        admission = AdmissionQueue(
            functools.partial(_inflight_limit, pool, settings.max_inflight_per_worker),
            reserve=lambda: _inflight_limit(pool, reserve) or 0,
            max_waiting=settings.max_waiting,
            queue_timeout_s=settings.queue_timeout_s,
            retry_after_s=settings.retry_after_s,
        )
        dispatcher = Dispatcher(
            pool,
            metrics,
            request_timeout_s=settings.request_timeout_s,
            max_attempts=settings.max_attempts,
            retry_after_s=settings.retry_after_s,
            classes=classes,
            admission=admission,
        )
        return cls(settings, metrics, pool, dispatcher, settings.load_api_keys() | classes.keys)

    def check_api_key(self, authorization: str | None) -> str | None:
        """The caller's identity (a digest of its key) when `Authorization: Bearer <key>` holds a configured key;
        None when no keys are configured (auth off: every caller is the same anonymous one). The identity owns the
        requests it sends (`Dispatcher`); AuthenticationError for a missing or wrong key."""
        if not self.api_keys:
            return None
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise AuthenticationError("missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")
        sent = token.strip().encode()
        matches = [caller for key, caller in self._callers.items() if hmac.compare_digest(sent, key)]
        if not matches:
            raise AuthenticationError("incorrect API key provided", code="invalid_api_key")
        return matches[0]


def _inflight_limit(pool: WorkerPool, per_worker: int) -> int | None:
    """`per_worker` requests per admitted worker: the gateway's own cap on requests in flight (None = no cap), or
    the slots past it kept for the most urgent class."""
    if not per_worker:
        return None
    return per_worker * max(1, sum(e.healthy for e in pool.endpoints.values()))


class GuardMiddleware:
    """Pure ASGI: API keys and the body-size limit on /v1/*, before any JSON parsing (so 401/413 come first)."""

    def __init__(self, app, get_state):
        self.app, self.get_state = app, get_state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)
        state: GatewayState = self.get_state()
        headers = dict(scope["headers"])
        try:
            caller = state.check_api_key(headers.get(b"authorization", b"").decode("latin-1"))
        except AuthenticationError as e:
            return await error_response(e)(scope, receive, send)
        # the server makes a scope (and its state, a copy of the lifespan's) per request: it may be changed in place
        scope.setdefault("state", {})["caller"] = caller  # read by dependencies.get_caller
        if scope["method"] != "POST":
            return await self.app(scope, receive, send)
        limit = state.settings.max_body_bytes
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await _too_large(limit)(scope, receive, send)
        body, more = [], True
        size = 0
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            size += len(message.get("body", b""))
            if size > limit:
                return await _too_large(limit)(scope, receive, send)
            body.append(message.get("body", b""))
            more = message.get("more_body", False)
        payload = b"".join(body)
        try:
            payload.decode("utf-8")
        except UnicodeDecodeError as e:
            error = BadRequestError(f"the body is not valid UTF-8 (byte {e.start}): send JSON encoded as UTF-8")
            return await error_response(error)(scope, receive, send)
        # OpenAI parses the body as JSON whatever the content type says; so does the gateway (the header is rewritten
        # unless it already says exactly that, once).
        if headers.get(b"content-type") != b"application/json" or len(headers) < len(scope["headers"]):
            scope["headers"] = [(k, v) for k, v in scope["headers"] if k != b"content-type"] + [
                (b"content-type", b"application/json")
            ]
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": payload, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _too_large(limit: int):
    return error_response(PayloadTooLargeError(f"the request body exceeds {limit} bytes", code="request_too_large"))


class GatewayApp(FastAPI):
    """FastAPI behind a front of our own: every HTTP request meets the guard (API keys, body limit) and the
    generation routes' fast path (hot_routes.py) first, under Starlette's server-error middleware (a 500 in
    OpenAI's envelope, the error logged), and only what the fast path leaves goes on to FastAPI's own stack.

    Why in front rather than as FastAPI middleware: FastAPI's stack wraps each request in its server-error,
    telemetry and body-limit middlewares and checks per request whether OpenTelemetry is configured, about a
    tenth of the gateway's CPU time on a whole completion against a fast upstream; the fast path needs none of it.
    Lifespan events go straight to FastAPI."""

    front: ASGIApp | None = None  # set by create_app once the routes are in

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.front is None:
            return await super().__call__(scope, receive, send)
        scope["app"] = self  # what Starlette sets: Request.app reads it
        await self.front(scope, receive, send)

    async def stack(self, scope, receive, send):
        """FastAPI's own handling of a request: its middleware stack, routing and exception handlers."""
        await super().__call__(scope, receive, send)


def create_app(settings: GatewaySettings | None = None, state: GatewayState | None = None) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        owned = state is None
        app.state.gateway = GatewayState.build(settings or GatewaySettings()) if state is None else state
        if owned:
            await app.state.gateway.pool.start()
        yield
        if owned:
            await app.state.gateway.pool.stop()

    app = GatewayApp(title="DeepSpec gateway", version="1", lifespan=lifespan, docs_url="/docs", redoc_url=None)
    for module in (completions, chat, models, health):
        app.include_router(module.router)
    install_error_handlers(app)
    # the guard, then the generation routes' fast path (hot_routes.py), then FastAPI
    hot = HotRoutes(app.stack, fastapi_app=app, routes=[*completions.router.routes, *chat.router.routes])
    app.front = ServerErrorMiddleware(
        GuardMiddleware(hot, get_state=lambda: app.state.gateway), handler=app.exception_handlers[Exception]
    )
    if not tracing.enabled():  # DEEPSPEC_TRACING (a caller, a test, may have configured it already)
        tracing.configure("deepspec-gateway")
    if tracing.enabled():  # the request's span around everything, 500s included; absent while off
        app.front = tracing.TracingMiddleware(app.front)
    return app


class _Server:
    """uvicorn without its own signal handling: the gateway drains on SIGTERM itself (readiness first)."""

    def __init__(self, app, host: str, port: int):
        import uvicorn

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):
                yield

        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_config=None,
            access_log=False,
            lifespan="on",
            http="httptools",
            timeout_graceful_shutdown=5,
            timeout_keep_alive=30,
        )
        self.server = Server(config)

    async def serve(self) -> None:
        await self.server.serve()

    @property
    def port(self) -> int:
        return self.server.servers[0].sockets[0].getsockname()[1]


async def serve_gateway(settings: GatewaySettings, stop: asyncio.Event | None = None, on_ready=None) -> int:
    """Run HTTP + gRPC until `stop` (default: SIGTERM/SIGINT), then drain and exit."""
    from service.gateway.grpc_api import start_grpc_server
    from service.signals import install_stop_signals

    stop = stop or install_stop_signals()
    state = GatewayState.build(settings)
    metrics_server = None
    if settings.metrics_port >= 0:  # its own port: scraped inside the cluster, never routed by the API's Ingress
        from service.metrics import start_metrics_server

        try:
            metrics_server = start_metrics_server(state.metrics.registry, settings.host, settings.metrics_port)
        except OSError as exc:
            logger.error("the metrics server did not start on %s:%d: %s", settings.host, settings.metrics_port, exc)
            return 1
    await state.pool.start()
    # gRPC listens before HTTP: once /health/ready answers, both APIs accept connections.
    grpc_server = grpc_port = None
    if settings.grpc_port >= 0:
        try:
            grpc_server, grpc_port = await start_grpc_server(state, settings.host, settings.grpc_port)
        except RuntimeError as exc:
            logger.error("%s (port in use?)", exc)
            await state.pool.stop()
            return 1
    http = _Server(create_app(state=state), settings.host, settings.http_port)
    http_task = asyncio.create_task(http.serve())
    while not http.server.started:
        if http_task.done():  # uvicorn exits (SystemExit) when it cannot bind; it has logged why
            with contextlib.suppress(BaseException):
                http_task.result()
            logger.error("the HTTP server did not start on %s:%d (port in use?)", settings.host, settings.http_port)
            if grpc_server is not None:
                await grpc_server.stop(0)
            await state.pool.stop()
            return 1
        await asyncio.sleep(0.02)
    metrics_port = http.port if metrics_server is None else metrics_server.server_port
    logger.info(
        "gateway listening",
        extra={
            "fields": {
                "msg": "gateway listening",
                "http": f"http://{_display(settings.host)}:{http.port}/v1",
                "grpc": None if grpc_port is None else f"{_display(settings.host)}:{grpc_port}",
                "metrics": f"http://{_display(settings.host)}:{metrics_port}/metrics",
                "workers": settings.workers,
                "auth": bool(state.api_keys),
            }
        },
    )
    if on_ready is not None:
        on_ready(http.port, grpc_port)
    await stop.wait()
    logger.info(
        "stopping: readiness false, draining %d in-flight requests for up to %.0f s",
        len(state.dispatcher.inflight),
        settings.drain_timeout_s,
    )
    if grpc_server is not None:
        await grpc_server.set_not_serving()
    await state.dispatcher.drain(settings.drain_timeout_s)
    state.dispatcher.cut(f"the gateway shut down and its drain timeout ({settings.drain_timeout_s:g} s) ran out")
    # the cut requests still have to write their error (an SSE event, a gRPC status): stopping the servers first
    # would end them with a bare "Cancelling all calls" instead
    await state.dispatcher.drain(CUT_GRACE_S)
    http.server.should_exit = True
    if grpc_server is not None:
        await grpc_server.stop(CUT_GRACE_S)
    await http_task
    await state.pool.stop()
    if metrics_server is not None:
        metrics_server.shutdown()
    return 0


def _display(host: str) -> str:
    return "localhost" if host in ("0.0.0.0", "::", "") else host
