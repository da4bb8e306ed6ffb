"""OpenTelemetry traces from the gateway to the worker (service/tracing.py): the worker's decode span belongs to the
gateway's trace, as the child of the gateway's call to it, carried by W3C `traceparent` in the gRPC metadata.

Both run in this process (a stub worker and the gateway app over it), so their spans meet in one in-memory exporter;
the worker's gRPC handlers run in tasks of the gRPC server, which do not share the gateway's contextvars, so only the
metadata can carry the trace across (the span's parent is remote, which says so too)."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from service import tracing
from service.worker.server import DECODE_SPAN, WorkerService
from service.worker.settings import WorkerSettings
from tests.service.conftest import in_process_gateway

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"  # a caller's W3C trace (the W3C spec's example ids)
TRACEPARENT = f"00-{CLIENT_TRACE}-b7ad6b7169203331-01"


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    tracing.configure("deepspec-test", processor=SimpleSpanProcessor(exporter))
    yield exporter
    tracing.shutdown()


async def _serve_and_ask(stream: bool, headers: dict) -> int:
    worker = WorkerService(
        WorkerSettings(target="stub", host="127.0.0.1", port=0, metrics_port=-1, drain_timeout_s=0, stub_step_ms=1)
    )
    await worker.start()
    try:
        async with in_process_gateway(f"127.0.0.1:{worker.port}", "the stub worker") as (client, _):
            response = await client.post(
                "/v1/completions",
                headers=headers,
                json={"model": "stub", "prompt": "Hello", "max_tokens": 8, "temperature": 0, "stream": stream},
            )
            await response.aread()
            return response.status_code
    finally:
        await worker.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_the_workers_decode_span_is_in_the_gateways_trace(spans, stream):
    assert asyncio.run(_serve_and_ask(stream, {})) == 200
    finished = spans.get_finished_spans()
    [http] = [s for s in finished if s.kind == SpanKind.SERVER and s.name == "POST /v1/completions"]
    [call] = [s for s in finished if s.kind == SpanKind.CLIENT]
    [decode] = [s for s in finished if s.name == DECODE_SPAN]
    assert call.name == ("deepspec.worker/ModelStreamInfer" if stream else "deepspec.worker/ModelInfer")
    assert http.context.trace_id == call.context.trace_id == decode.context.trace_id
    assert call.parent.span_id == http.context.span_id
    assert decode.parent.span_id == call.context.span_id and decode.parent.is_remote  # came over gRPC metadata
    assert http.attributes["http.response.status_code"] == 200
    assert decode.attributes["gen_ai.request.model"] == "stub" and decode.attributes["deepspec.stream"] is stream


def test_a_callers_traceparent_makes_the_gateways_span_its_child(spans):
    assert asyncio.run(_serve_and_ask(True, {"traceparent": TRACEPARENT})) == 200
    finished = spans.get_finished_spans()
    [http] = [s for s in finished if s.name == "POST /v1/completions"]
    [decode] = [s for s in finished if s.name == DECODE_SPAN]
    assert format(http.context.trace_id, "032x") == format(decode.context.trace_id, "032x") == CLIENT_TRACE
    assert format(http.parent.span_id, "016x") == "b7ad6b7169203331"


def test_off_by_default_nothing_is_recorded_or_sent(monkeypatch):
    monkeypatch.delenv(tracing.ENV, raising=False)
    tracing.shutdown()
    assert tracing.configure("deepspec-test") is False and not tracing.enabled()
    assert tracing.client_span("x", {}) == (None, {})
    with tracing.server_span("y", [("traceparent", TRACEPARENT)]) as span:
        assert span is None


def test_the_exporter_comes_from_the_environment():
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    assert tracing.exporter_from_env({}) is None and tracing.exporter_from_env({tracing.ENV: "off"}) is None
    assert isinstance(tracing.exporter_from_env({tracing.ENV: "console"}), ConsoleSpanExporter)
    assert isinstance(tracing.exporter_from_env({tracing.ENV: "OTLP"}), OTLPSpanExporter)
    with pytest.raises(ValueError, match="DEEPSPEC_TRACING='jaeger': expected one of off, console, otlp"):
        tracing.exporter_from_env({tracing.ENV: "jaeger"})
