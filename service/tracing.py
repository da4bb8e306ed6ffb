"""OpenTelemetry traces from the gateway to the worker, with W3C trace context; off unless asked for.

    DEEPSPEC_TRACING=otlp      # OTLP over HTTP: OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
                               # (default http://localhost:4318/v1/traces) and the SDK's other OTEL_* variables
    DEEPSPEC_TRACING=console   # each finished span as JSON on stdout
    DEEPSPEC_TRACING=off       # (or unset) no provider: the API's no-op tracer, nothing recorded or sent

What a trace holds: the gateway's HTTP request (a SERVER span; a `traceparent` the client sent makes it a child of
the client's trace), one CLIENT span per call to a worker (a retry on another worker is a second one), and the
worker's SERVER span around the request's decode, whose parent is that CLIENT span: the gateway puts the W3C
`traceparent` / `tracestate` of the CLIENT span into the gRPC metadata (gRPC metadata keys are lowercase HTTP/2
headers, as W3C's are), and the worker takes it out. The same metadata from any other client (a Triton-style
caller that traces) is honoured the same way.

While tracing is off every helper here returns at once (a module-level flag), so the gateway's hot path pays one
attribute read per request. The SDK and the exporter are imported only when tracing is turned on.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Iterator, Sequence

from opentelemetry import propagate, trace

logger = logging.getLogger(__name__)

ENV = "DEEPSPEC_TRACING"
EXPORTERS = ("off", "console", "otlp")
_TRACER_NAME = "deepspec"
_enabled = False
#: this module's own provider, not the API's global one (which refuses a second provider in one process, and which
#: an embedding application may own): the spans carry their context, so propagation needs no global
_provider = None


def enabled() -> bool:
    return _enabled


def exporter_from_env(environ=os.environ):
    """The span exporter DEEPSPEC_TRACING asks for, or None for off; a value outside EXPORTERS is an error."""
    choice = environ.get(ENV, "off").strip().lower() or "off"
    if choice not in EXPORTERS:
        raise ValueError(f"{ENV}={choice!r}: expected one of {', '.join(EXPORTERS)}")
    if choice == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if choice == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    return None


def _batched(exporter):
    """Spans exported in batches from a background thread (the request path never waits on the collector)."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    return BatchSpanProcessor(exporter)


def configure(service_name: str, exporter=None, *, processor=None) -> bool:
    """Install a TracerProvider for this process (service.name `service_name`) exporting through `exporter` (batched)
    or `processor` (as given: tests pass a SimpleSpanProcessor over an in-memory exporter). With neither, the exporter
    DEEPSPEC_TRACING names; when that is off, nothing is installed. Returns whether tracing is on."""
    global _enabled, _provider
    if processor is None:
        exporter = exporter if exporter is not None else exporter_from_env()
        if exporter is None:
            shutdown()
            return False
        processor = _batched(exporter)
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(processor)
    shutdown()
    _provider, _enabled = provider, True
    logger.info("tracing on: %s spans as service %r", type(exporter or processor).__name__, service_name)
    return True


def shutdown() -> None:
    """Flush and stop the provider (a batch exporter sends what it holds)."""
    global _enabled, _provider
    if _provider is not None:
        with contextlib.suppress(Exception):
            _provider.shutdown()
    _provider, _enabled = None, False


def tracer() -> trace.Tracer:
    return _provider.get_tracer(_TRACER_NAME) if _provider is not None else trace.get_tracer(_TRACER_NAME)


def client_span(name: str, attributes: dict) -> tuple[trace.Span | None, dict]:
    """A CLIENT span, child of the current one, not made current (it outlives the caller's frame in an async
    generator), and the keyword arguments of the gRPC call that carry it to the callee (`metadata=`); (None, {})
    while tracing is off, so the call is made exactly as without tracing."""
    if not _enabled:
        return None, {}
    span = tracer().start_span(name, kind=trace.SpanKind.CLIENT, attributes=attributes)
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return span, {"metadata": tuple(carrier.items())}


def end_span(span: trace.Span | None, error: BaseException | None = None) -> None:
    if span is None:
        return
    if error is not None:
        span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}"))
    span.end()


@contextlib.contextmanager
def server_span(
    name: str, metadata: Iterable[tuple[str, str | bytes]] | None, attributes: dict | None = None
) -> Iterator[trace.Span | None]:
    """A SERVER span, child of the W3C context in the incoming `metadata` (gRPC's invocation metadata or HTTP
    headers as pairs), current for the block; yields None while tracing is off."""
    if not _enabled:
        yield None
        return
    carrier = {key.lower(): value.decode() if isinstance(value, bytes) else value for key, value in metadata or ()}
    parent = propagate.extract(carrier)
    with tracer().start_as_current_span(
        name, context=parent, kind=trace.SpanKind.SERVER, attributes=attributes or {}
    ) as span:
        yield span


class TracingMiddleware:
    """The gateway's HTTP request span, as a plain ASGI middleware (added only while tracing is on): named
    `<method> <path>`, a child of the client's `traceparent` if it sent one, with the response status."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers: Sequence[tuple[bytes, bytes]] = scope.get("headers", ())
        pairs = [(key.decode("latin-1"), value.decode("latin-1")) for key, value in headers]
        attributes = {"http.request.method": scope["method"], "url.path": scope["path"]}
        with server_span(f"{scope['method']} {scope['path']}", pairs, attributes) as span:

            async def send_with_status(message):
                if message["type"] == "http.response.start" and span is not None:
                    span.set_attribute("http.response.status_code", message["status"])
                    if message["status"] >= 500:
                        span.set_status(trace.Status(trace.StatusCode.ERROR))
                await send(message)

            await self.app(scope, receive, send_with_status)
