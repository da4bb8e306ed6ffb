"""Every Prometheus metric name DeepSpec exports, in one place.

Names follow vLLM's where one exists, with the `deepspec:` prefix. The Grafana dashboards and alert rules in
`helm/deepspec` use exactly these names (a test checks it). Labels: `model` everywhere; `worker` on the
gateway's copies; `class` (the request's service class, deepspec_protocol/worker.py SERVICE_CLASSES: three values
at most) on the speculative-decoding metrics, so acceptance can be read per class. Useful PromQL:

    mean acceptance length = 1 + rate(deepspec:spec_decode_num_accepted_tokens_total[5m])
                               / rate(deepspec:spec_decode_num_drafts_total[5m])
        (τ: tokens per verify round that checked drafts, as the engine's AcceptanceStats.acceptance_length,
        eval.json and the request log count it; rounds left without drafts are in none of these counters)
    acceptance rate        = rate(deepspec:spec_decode_num_accepted_tokens_total[5m])
                               / rate(deepspec:spec_decode_num_draft_tokens_total[5m])
    tokens per forward     = rate(deepspec:spec_decode_num_forward_tokens_total[5m])
                               / rate(deepspec:spec_decode_num_forwards_total[5m])
        (every decode round a request took part in, drafted or not, its accepted drafts + 1 over its rounds, as
        AcceptanceStats.tokens_per_forward and eval.json count it: 1.0 = speculation bought nothing, however high
        τ is on the few rounds that drafted; workers only)
    p99 TTFT               = histogram_quantile(0.99,
                               sum by (le) (rate(deepspec:time_to_first_token_seconds_bucket[5m])))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from deepspec_protocol.worker import DEFAULT_SERVICE_CLASS

if TYPE_CHECKING:
    from prometheus_client import Counter

# Latency histograms (seconds).
TIME_TO_FIRST_TOKEN_SECONDS = "deepspec:time_to_first_token_seconds"
INTER_TOKEN_LATENCY_SECONDS = "deepspec:inter_token_latency_seconds"  # between streamed chunks
TIME_PER_OUTPUT_TOKEN_SECONDS = "deepspec:time_per_output_token_seconds"  # per request: (e2e - ttft) / (n - 1)
E2E_REQUEST_LATENCY_SECONDS = "deepspec:e2e_request_latency_seconds"
REQUEST_QUEUE_TIME_SECONDS = "deepspec:request_queue_time_seconds"

# Scheduler state gauges (vLLM meaning: running = in the batch, waiting = queued for a slot).
NUM_REQUESTS_RUNNING = "deepspec:num_requests_running"
NUM_REQUESTS_WAITING = "deepspec:num_requests_waiting"

# Token counters.
PROMPT_TOKENS_TOTAL = "deepspec:prompt_tokens_total"
GENERATION_TOKENS_TOTAL = "deepspec:generation_tokens_total"

# Request outcomes, label `status` (finish reason or error kind).
REQUEST_SUCCESS_TOTAL = "deepspec:request_success_total"

# Speculative decoding.
SPEC_DECODE_NUM_DRAFTS_TOTAL = "deepspec:spec_decode_num_drafts_total"
SPEC_DECODE_NUM_DRAFT_TOKENS_TOTAL = "deepspec:spec_decode_num_draft_tokens_total"
SPEC_DECODE_NUM_ACCEPTED_TOKENS_TOTAL = "deepspec:spec_decode_num_accepted_tokens_total"
SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS_TOTAL = (
    "deepspec:spec_decode_num_accepted_tokens_per_pos_total"  # label `position`
)
SPEC_DECODE_ACCEPTANCE_LENGTH = "deepspec:spec_decode_acceptance_length"  # histogram: τ of each drafted round
SPEC_DECODE_NUM_FORWARDS_TOTAL = "deepspec:spec_decode_num_forwards_total"  # decode rounds, drafted or not
SPEC_DECODE_NUM_FORWARD_TOKENS_TOTAL = "deepspec:spec_decode_num_forward_tokens_total"  # accepted + 1 per round

# Routing state on the gateway, label `worker` (no vLLM equivalent).
GATEWAY_NUM_REQUESTS_OUTSTANDING = "deepspec:gateway_num_requests_outstanding"  # sent to a worker, not finished
GATEWAY_WORKER_HEALTHY = "deepspec:gateway_worker_healthy"  # 1 = admitted, 0 = ejected
GATEWAY_RETRIES_TOTAL = "deepspec:gateway_retries_total"  # a request moved to another worker before its first token

# The Gateway API Inference Extension's model-server gauges, on the workers, under the names its model-server
# protocol lists for vLLM (gateway-api-inference-extension docs/proposals/003-model-server-protocol:
# TotalQueuedRequests, TotalRunningRequests, KVCacheUtilization), label `model_name` as vLLM's: an InferencePool's
# endpoint picker reads a DeepSpec worker as it reads a vLLM pod, with its default flags. Not `deepspec:` names: the
# dashboards keep theirs.
INFERENCE_EXTENSION_NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
INFERENCE_EXTENSION_NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
INFERENCE_EXTENSION_KV_CACHE_USAGE_PERC = "vllm:kv_cache_usage_perc"  # a fraction, 0..1, as vLLM's
INFERENCE_EXTENSION_GAUGES = (
    INFERENCE_EXTENSION_NUM_REQUESTS_WAITING,
    INFERENCE_EXTENSION_NUM_REQUESTS_RUNNING,
    INFERENCE_EXTENSION_KV_CACHE_USAGE_PERC,
)

#: every name above, for tests and the chart's dashboards check
ALL_METRIC_NAMES = tuple(
    v for k, v in dict(globals()).items() if k.isupper() and isinstance(v, str) and v.startswith("deepspec:")
)

# ---------------------------------------------------------------------------------------------------------------
# prometheus_client objects. Each process part (worker, gateway) registers into its own CollectorRegistry, so the
# embedded default can host both in one process and tests can build as many as they like.

#: latency buckets (seconds): fine below 10 ms for engine steps and gateway overhead, up to minutes for long requests
LATENCY_BUCKETS_SECONDS = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    7.5,
    10.0,
    15.0,
    20.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
#: tokens committed per verify round that checked drafts (accepted drafts + the bonus token)
ACCEPTANCE_LENGTH_BUCKETS = tuple(float(i) for i in range(1, 17))


class _LatencyMetrics:
    """Histograms and counters that both the worker and the gateway export (the gateway adds `worker`)."""

    def __init__(self, registry, labels: tuple[str, ...]):
        from prometheus_client import Counter, Histogram

        def hist(name, doc):
            return Histogram(name, doc, labels, buckets=LATENCY_BUCKETS_SECONDS, registry=registry)

        self.time_to_first_token = hist(TIME_TO_FIRST_TOKEN_SECONDS, "Time from request arrival to its first token.")
        self.inter_token_latency = hist(INTER_TOKEN_LATENCY_SECONDS, "Time between consecutive streamed chunks.")
        self.time_per_output_token = hist(
            TIME_PER_OUTPUT_TOKEN_SECONDS, "Per request: (e2e - ttft) / (output tokens - 1)."
        )
        self.e2e_request_latency = hist(E2E_REQUEST_LATENCY_SECONDS, "Time from request arrival to its last token.")
        self.prompt_tokens = Counter(PROMPT_TOKENS_TOTAL, "Prompt tokens processed.", labels, registry=registry)
        self.generation_tokens = Counter(GENERATION_TOKENS_TOTAL, "Tokens generated.", labels, registry=registry)
        self.request_success = Counter(
            REQUEST_SUCCESS_TOTAL,
            "Finished requests by status (finish reason or error kind).",
            (*labels, "status"),
            registry=registry,
        )
        spec_labels = (*labels, "class")  # read their children through `series((*labels, service_class))`
        self.spec_decode_num_draft_tokens = Counter(
            SPEC_DECODE_NUM_DRAFT_TOKENS_TOTAL, "Draft tokens proposed.", spec_labels, registry=registry
        )
        self.spec_decode_num_accepted_tokens = Counter(
            SPEC_DECODE_NUM_ACCEPTED_TOKENS_TOTAL,
            "Draft tokens accepted by the target.",
            spec_labels,
            registry=registry,
        )
        self.spec_decode_num_drafts = Counter(
            SPEC_DECODE_NUM_DRAFTS_TOTAL,
            "Verify rounds that checked at least one draft token.",
            spec_labels,
            registry=registry,
        )
        self._series: dict[tuple[str, ...], LabelledSeries] = {}

    def series(self, labels: tuple[str, ...]) -> LabelledSeries:
        """The children of one label set, looked up once and kept: `labels()` checks the values and takes a lock on
        every call, which the gateway would otherwise pay on every streamed chunk."""
        found = self._series.get(labels)
        if found is None:
            found = self._series[labels] = LabelledSeries(self, labels)
        return found

    def observe_request(
        self,
        labels: tuple[str, ...],
        *,
        status: str,
        arrival: float,
        first_token: float | None,
        finished: float,
        num_prompt_tokens: int,
        num_output_tokens: int,
    ) -> None:
        """Record one finished request; times are `time.perf_counter()` stamps (no clock inside)."""
        series = self.series(labels)
        series.request_success(status).inc()
        series.prompt_tokens.inc(num_prompt_tokens)
        series.generation_tokens.inc(num_output_tokens)
        if first_token is None:
            return
        series.e2e_request_latency.observe(finished - arrival)
        if num_output_tokens > 1:
            series.time_per_output_token.observe((finished - first_token) / (num_output_tokens - 1))


class LabelledSeries:
    """One label set's children of the metrics in `_LatencyMetrics` (its `series`), under the same attribute names
    (`series.time_to_first_token.observe(...)`). Each child is looked up on first use, so a series still appears only
    once something is recorded in it; none of these is ever removed, so a kept child never goes stale. The
    speculative-decoding counters carry one label more (`class`): read them from the series of the longer label set."""

    def __init__(self, metrics: _LatencyMetrics, labels: tuple[str, ...]):
        self._metrics, self.labels = metrics, labels
        self._success_by_status: dict[str, Counter] = {}

    def __getattr__(self, name: str):  # only for a child not looked up yet: later reads find the attribute
        child = getattr(self._metrics, name).labels(*self.labels)
        setattr(self, name, child)
        return child

    def request_success(self, status: str) -> Counter:
        """deepspec:request_success_total's child for `status` (a finish reason or an error kind)."""
        child = self._success_by_status.get(status)
        if child is None:
            child = self._success_by_status[status] = self._metrics.request_success.labels(*self.labels, status)
        return child


class WorkerMetrics(_LatencyMetrics):
    """The worker's metrics, label `model`. Serve with `prometheus_client.start_http_server(port, registry=...)`."""

    def __init__(self, model: str, registry=None):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = registry if registry is not None else CollectorRegistry()
        super().__init__(self.registry, ("model",))
        self.model = model
        self.request_queue_time = Histogram(
            REQUEST_QUEUE_TIME_SECONDS,
            "Time a request waited for a batch slot.",
            ("model",),
            buckets=LATENCY_BUCKETS_SECONDS,
            registry=self.registry,
        )
        self.num_requests_running = Gauge(
            NUM_REQUESTS_RUNNING, "Requests in the running batch.", ("model",), registry=self.registry
        )
        self.num_requests_waiting = Gauge(
            NUM_REQUESTS_WAITING, "Requests queued for a batch slot.", ("model",), registry=self.registry
        )
        self.inference_extension = {
            name: Gauge(name, doc, ("model_name",), registry=self.registry).labels(model)
            for name, doc in zip(
                INFERENCE_EXTENSION_GAUGES,
                (
                    "Requests queued for a batch slot (Inference Extension: TotalQueuedRequests).",
                    "Requests in the running batch (Inference Extension: TotalRunningRequests).",
                    "KV positions the running rows hold over what the batch's caches hold, 0..1 "
                    "(Inference Extension: KVCacheUtilization).",
                ),
            )
        }
        self.spec_decode_num_accepted_tokens_per_pos = Counter(
            SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS_TOTAL,
            "Verify rounds in which draft position `position` was accepted.",
            ("model", "class", "position"),
            registry=self.registry,
        )
        self.spec_decode_acceptance_length = Histogram(
            SPEC_DECODE_ACCEPTANCE_LENGTH,
            "Tokens committed per verify round with drafts (accepted + bonus).",
            ("model", "class"),
            buckets=ACCEPTANCE_LENGTH_BUCKETS,
            registry=self.registry,
        )
        self.spec_decode_num_forwards = Counter(
            SPEC_DECODE_NUM_FORWARDS_TOTAL,
            "Decode rounds (target verify passes) of requests, drafted or not.",
            ("model", "class"),
            registry=self.registry,
        )
        self.spec_decode_num_forward_tokens = Counter(
            SPEC_DECODE_NUM_FORWARD_TOKENS_TOTAL,
            "Tokens those rounds committed (accepted drafts + 1 each).",
            ("model", "class"),
            registry=self.registry,
        )

    def observe_decode_round(self, num_accepted_tokens: int, service_class: str = DEFAULT_SERVICE_CLASS) -> None:
        """One decode round of one request of `service_class`, drafted or not: it committed its accepted drafts and
        the target's own token."""
        self.spec_decode_num_forwards.labels(self.model, service_class).inc()
        self.spec_decode_num_forward_tokens.labels(self.model, service_class).inc(1 + num_accepted_tokens)

    def observe_spec_round(
        self, num_draft_tokens: int, num_accepted_tokens: int, service_class: str = DEFAULT_SERVICE_CLASS
    ) -> None:
        """One verify round of one request of `service_class`: positions 0..accepted-1 were accepted (accepted
        drafts are a prefix)."""
        if num_draft_tokens <= 0:
            return
        series = self.series((self.model, service_class))
        series.spec_decode_num_drafts.inc()
        series.spec_decode_num_draft_tokens.inc(num_draft_tokens)
        series.spec_decode_num_accepted_tokens.inc(num_accepted_tokens)
        for position in range(num_accepted_tokens):
            self.spec_decode_num_accepted_tokens_per_pos.labels(self.model, service_class, str(position)).inc()
        self.spec_decode_acceptance_length.labels(self.model, service_class).observe(1 + num_accepted_tokens)


class GatewayMetrics(_LatencyMetrics):
    """The gateway's copies, labels `model` and `worker`, plus its routing state. One process serves them."""

    def __init__(self, registry=None):
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = registry if registry is not None else CollectorRegistry()
        super().__init__(self.registry, ("model", "worker"))
        self.num_requests_outstanding = Gauge(
            GATEWAY_NUM_REQUESTS_OUTSTANDING,
            "Requests sent to a worker and not finished.",
            ("worker",),
            registry=self.registry,
        )
        self.worker_healthy = Gauge(
            GATEWAY_WORKER_HEALTHY,
            "1 while the worker is admitted to routing, 0 while ejected.",
            ("worker",),
            registry=self.registry,
        )
        self.retries = Counter(
            GATEWAY_RETRIES_TOTAL,
            "Requests retried on another worker before their first token.",
            ("worker",),
            registry=self.registry,
        )


def exposition(registry) -> tuple[bytes, str]:
    """The registry in the Prometheus text format 0.0.4, whatever the scraper asks for.

    prometheus_client's OpenMetrics negotiation escapes `:` to `_` (deepspec_time_to_first_token_seconds), which
    would break every dashboard and alert; the classic text format keeps the names as written above.
    """
    from prometheus_client import generate_latest

    return generate_latest(registry), "text/plain; version=0.0.4; charset=utf-8"


def start_metrics_server(registry, host: str, port: int):
    """Serve GET /metrics on a daemon thread; returns the server (`.server_port`, `.shutdown()`)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self.send_error(404, "only /metrics here")
                return
            body, content_type = exposition(registry)
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # scrapes are not worth a log line each
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
