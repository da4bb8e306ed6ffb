"""A real Prometheus (Debian's `prometheus`) scrapes DeepSpec and answers every dashboard query.

Sources, told apart by the `namespace` label Prometheus attaches (the dashboards' `$namespace` variable):
- `inference`: the service's own metric objects (`service.metrics.GatewayMetrics` / `WorkerMetrics`) served the way
  the gateway's `/metrics` route serves them and fed synthetic traffic by a thread: every panel, with every label
  value the dashboards split by (several workers, positions, statuses);
- `live`: the running service itself, `python -m service worker --target stub` behind `python -m service gateway`,
  with completions sent through the gateway's OpenAI API. When it cannot start, its tests fail on CI (`CI` set)
  and are skipped elsewhere;
- `engine-<runtime>`: each serving engine's recorded `/metrics` (tests/helm/fixtures/engines: vLLM, SGLang,
  TensorRT-LLM, Triton, DeepSpec), its counters growing with every scrape.
Prometheus runs the chart's rendered PrometheusRule (recording rules and alerts) plus each runtime's recording rules,
so the Engine dashboard is checked against what the rules record from every engine's own names.
Scrapes run every second under the job names the chart's ServiceMonitors produce.
"""

from __future__ import annotations

import http.server
import itertools
import json
import math
import os
import random
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
import yaml

from deepspec_protocol.worker import SERVICE_CLASSES
from service.metrics import GatewayMetrics, WorkerMetrics
from tests.helm.conftest import NAMESPACE, RELEASE, REPO, require_tool
from tests.helm.promql import (
    EXTERNAL_METRICS,
    FIXTURE_JOBS,
    dashboard_queries,
    dashboards,
    engine_metrics,
    exposition,
    fill_selectors,
    fixture_samples,
    metric_names,
    prometheus_rule,
    rule_exprs,
    substitute,
)
from tests.ports import free_port

pytestmark = pytest.mark.integration

MODEL = "smollm2-135m"
WORKERS = ("10.0.0.7:8001", "10.0.0.8:8001")
RATE_WINDOW = "10s"  # Grafana would send $__rate_interval = 4 x the 1 s scrape interval at least


class Exporters:
    """What the cluster's exporters would serve next to DeepSpec, for the panels and alerts that read them:
    kube-state-metrics (restarts), NVIDIA's DCGM exporter (GPUs, with its pod mapping) and a Triton worker."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = CollectorRegistry()
        pod = {"namespace": NAMESPACE, "pod": f"{RELEASE}-worker-5c6b7-x2x9z"}
        self.restarts = Counter(
            "kube_pod_container_status_restarts", "restarts", ("namespace", "pod", "container"), registry=self.registry
        ).labels(**pod, container="worker")
        self.gpu_util = Gauge(
            "DCGM_FI_DEV_GPU_UTIL", "GPU utilization (%)", ("namespace", "pod", "gpu"), registry=self.registry
        ).labels(**pod, gpu="0")
        self.fb_used = Gauge(
            "DCGM_FI_DEV_FB_USED", "framebuffer used (MiB)", ("namespace", "pod", "gpu"), registry=self.registry
        ).labels(**pod, gpu="0")
        triton = {"namespace": NAMESPACE, "model": "ensemble"}
        self.pending = Gauge(
            "nv_inference_pending_request_count", "pending", ("namespace", "model"), registry=self.registry
        ).labels(**triton)
        self.active = Gauge(
            "nv_trt_llm_request_metrics", "requests", ("namespace", "model", "request_type"), registry=self.registry
        ).labels(**triton, request_type="active")
        # the exported Triton LLM-API model's own queue gauges (export/triton/llmapi_model.py)
        llmapi = {"namespace": NAMESPACE, "model": "tensorrt_llm"}
        self.llmapi_waiting = Gauge(
            "deepspec_llmapi_num_requests_waiting", "waiting", ("namespace", "model"), registry=self.registry
        ).labels(**llmapi)
        self.llmapi_running = Gauge(
            "deepspec_llmapi_num_requests_running", "running", ("namespace", "model"), registry=self.registry
        ).labels(**llmapi)

    def step(self, rng: random.Random) -> None:
        if rng.random() < 0.01:
            self.restarts.inc()
        self.gpu_util.set(rng.uniform(40, 95))
        self.fb_used.set(rng.uniform(30_000, 70_000))
        self.pending.set(rng.randint(0, 4))
        self.active.set(rng.randint(1, 8))
        self.llmapi_waiting.set(rng.randint(0, 4))
        self.llmapi_running.set(rng.randint(1, 8))


def _traffic(gateway: GatewayMetrics, worker: WorkerMetrics, exporters: Exporters, stop: threading.Event) -> None:
    """A few hundred requests a second, spread over two workers, with drafts mostly accepted."""
    rng = random.Random(0)
    # finish reasons, a server error (5xx), a 429 and a 503, in a fixed cycle of 40 requests: every status panel has a
    # series in every rate window however slowly this thread runs on a loaded machine (errors 2 in 40)
    statuses = itertools.cycle(["worker_error", "server_busy", "no_worker"] + ["length"] * 6 + ["stop"] * 31)
    while not stop.is_set():
        now = time.perf_counter()
        for name in WORKERS:
            labels = (MODEL, name)
            status = next(statuses)
            ttft = rng.uniform(0.02, 0.4)
            gateway.time_to_first_token.labels(*labels).observe(ttft)
            gateway.inter_token_latency.labels(*labels).observe(rng.uniform(0.005, 0.05))
            gateway.observe_request(
                labels,
                status=status,
                arrival=now - 1.0,
                first_token=now - 1.0 + ttft,
                finished=now,
                num_prompt_tokens=rng.randint(10, 200),
                num_output_tokens=rng.randint(2, 64),
            )
            num_draft, num_accepted = 7, rng.randint(0, 7)
            spec = (*labels, rng.choice(SERVICE_CLASSES))  # the spec-decode series carry the request's class
            gateway.spec_decode_num_drafts.labels(*spec).inc()
            gateway.spec_decode_num_draft_tokens.labels(*spec).inc(num_draft)
            gateway.spec_decode_num_accepted_tokens.labels(*spec).inc(num_accepted)
            gateway.num_requests_outstanding.labels(name).set(rng.randint(0, 8))
            gateway.worker_healthy.labels(name).set(1)
            if rng.random() < 0.05:
                gateway.retries.labels(name).inc()
        worker.observe_request(
            (MODEL,),
            status="stop",
            arrival=now - 1.0,
            first_token=now - 0.9,
            finished=now,
            num_prompt_tokens=50,
            num_output_tokens=20,
        )
        worker.time_to_first_token.labels(MODEL).observe(0.1)
        worker.request_queue_time.labels(MODEL).observe(rng.uniform(0.0, 0.2))
        accepted = rng.randint(0, 7)
        worker.observe_spec_round(num_draft_tokens=7, num_accepted_tokens=accepted)
        worker.observe_decode_round(accepted)
        worker.num_requests_running.labels(MODEL).set(rng.randint(1, 8))
        worker.num_requests_waiting.labels(MODEL).set(rng.randint(0, 4))
        exporters.step(rng)
        stop.wait(0.02)


def _serve(registry=None, render=None) -> http.server.ThreadingHTTPServer:
    """`/metrics` as service/gateway/routers/health.py serves it (always the text format), from a registry or from
    `render()` (a recorded engine's text)."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if render is not None:
                body = render().encode()
            else:
                assert registry is not None, "_serve serves a registry or render()"
                body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _engine_namespace(runtime: str) -> str:
    return f"engine-{runtime}"


def _recorded_engine(fixture: str):
    """A `render()` for `_serve`: the recorded file with its counters multiplied by the number of scrapes so far."""
    samples, scrapes = fixture_samples(fixture), [0]

    def render() -> str:
        scrapes[0] += 1
        return exposition(samples, scrapes[0])

    return render


def _rule_groups(live: bool) -> list[dict]:
    """The chart's rendered rules (release `deepspec`, namespace `inference`, runtime deepspec), the same engine
    recordings for the live service's jobs, and each runtime's recordings for its recorded engine."""
    groups = prometheus_rule()["groups"]
    copies = [("live", "live", "deepspec")] if live else []
    copies += [(RELEASE, _engine_namespace(rt), rt) for rt in engine_metrics.RUNTIMES]
    for release, namespace, runtime in copies:
        groups.append(
            {
                "name": f"engine-{namespace}",
                "rules": [
                    {"record": r["record"], "expr": fill_selectors(r["expr"], release, namespace)}
                    for r in engine_metrics.recording_rules(runtime)
                ],
            }
        )
    return groups


API_KEY = "sk-live-test"


class LiveService:
    """A stub worker and a real gateway in front of it, as `helm install` wires them, on free local ports."""

    def __init__(self, log_dir):
        self.grpc_port, self.metrics_port, self.http_port = free_port(), free_port(), free_port()
        self.gateway_metrics_port = free_port()  # the chart serves the gateway's /metrics on its own port
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.log_dir = log_dir
        # the logs outlive __init__: the processes write them until close() closes them
        self.logs = [open(log_dir / name, "w") for name in ("worker.log", "gateway.log")]  # noqa: SIM115 (see above)
        common = [sys.executable, "-m", "service"]
        self.processes = [
            subprocess.Popen(
                [
                    *common,
                    "worker",
                    "--target",
                    "stub",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.grpc_port),
                    "--metrics-port",
                    str(self.metrics_port),
                    "--drain-timeout-s",
                    "0",
                    "--stub-step-ms",
                    "2",
                ],
                cwd=REPO,
                stdout=self.logs[0],
                stderr=subprocess.STDOUT,
            ),
            subprocess.Popen(
                [
                    *common,
                    "gateway",
                    "--workers",
                    f"127.0.0.1:{self.grpc_port}",
                    "--host",
                    "127.0.0.1",
                    "--http-port",
                    str(self.http_port),
                    "--grpc-port",
                    "-1",
                    "--drain-timeout-s",
                    "0",
                    "--metrics-port",
                    str(self.gateway_metrics_port),
                    "--health-interval-s",
                    "0.5",
                ],
                cwd=REPO,
                stdout=self.logs[1],
                stderr=subprocess.STDOUT,
                env={**os.environ, "DEEPSPEC_API_KEYS": API_KEY},
            ),
        ]

    def wait_ready(self, timeout_s: float = 45) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and all(p.poll() is None for p in self.processes):
            try:
                with urllib.request.urlopen(f"{self.url}/health/ready", timeout=1) as response:
                    if response.status == 200:
                        return True
            except OSError:
                pass
            time.sleep(0.3)
        return False

    def log_tail(self) -> str:
        return "\n".join(
            f"--- {name}\n{(self.log_dir / name).read_text(errors='replace')[-2000:]}"
            for name in ("worker.log", "gateway.log")
        )

    def complete(self, prompt: str, stream: bool) -> None:
        body = json.dumps(
            {"model": "stub", "prompt": prompt, "max_tokens": 16, "temperature": 0, "stream": stream}
        ).encode()
        request = urllib.request.Request(
            f"{self.url}/v1/completions",
            body,
            {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()

    def traffic(self, stop: threading.Event) -> None:
        n = 0
        while not stop.is_set():
            try:
                self.complete(f"request {n}: the quick brown fox", stream=n % 2 == 1)
            except OSError:
                pass
            n += 1
            stop.wait(0.05)

    def close(self) -> None:
        for process in self.processes:
            _stop(process)
        for log in self.logs:
            log.close()


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class Scrape:
    """What the tests get: Prometheus' URL and the live service, if it runs (else why it did not)."""

    def __init__(self, url: str, live: LiveService | None, live_failure: str = ""):
        self.url, self._live, self.live_failure = url, live, live_failure

    @property
    def live(self) -> LiveService:
        """The running service; a failure on CI (where `make test` must be able to start it), a skip elsewhere."""
        if self._live is None:
            message = f"the service (stub worker + gateway) did not start in this checkout:\n{self.live_failure}"
            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message)
        return self._live


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    binary = require_tool("prometheus")
    tmp = tmp_path_factory.mktemp("prometheus")
    gateway, worker, exporters = GatewayMetrics(), WorkerMetrics(MODEL), Exporters()
    servers = [_serve(m.registry) for m in (gateway, worker, exporters)]
    stop = threading.Event()
    threads = [threading.Thread(target=_traffic, args=(gateway, worker, exporters, stop), daemon=True)]
    live, live_failure = LiveService(tmp), ""
    if live.wait_ready():
        threads.append(threading.Thread(target=live.traffic, args=(stop,), daemon=True))
    else:
        live.close()
        live, live_failure = None, live.log_tail()
    for thread in threads:
        thread.start()

    # (job name, namespace) -> port; a recorded engine's jobs carry the chart's job names in their own namespace
    targets = {
        (f"{RELEASE}-gateway", NAMESPACE): servers[0].server_port,
        (f"{RELEASE}-worker", NAMESPACE): servers[1].server_port,
        ("exporters", NAMESPACE): servers[2].server_port,
    }
    for runtime, jobs in FIXTURE_JOBS.items():
        for job, fixture in jobs.items():
            servers.append(_serve(render=_recorded_engine(fixture)))
            targets[(f"{RELEASE}-{job}", _engine_namespace(runtime))] = servers[-1].server_port
    if live is not None:
        targets |= {("live-gateway", "live"): live.gateway_metrics_port, ("live-worker", "live"): live.metrics_port}
    (tmp / "rules.yaml").write_text(yaml.safe_dump({"groups": _rule_groups(live is not None)}, sort_keys=False))
    # Prometheus wants each job name once: the recorded engines reuse the chart's job names, so a job gets one
    # static config per namespace.
    static_configs: dict[str, list] = {}
    for (job, namespace), port in targets.items():
        target = {"targets": [f"127.0.0.1:{port}"], "labels": {"namespace": namespace}}
        static_configs.setdefault(job, []).append(target)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp / "rules.yaml")],
        "scrape_configs": [
            {"job_name": job, "honor_labels": job == "exporters", "static_configs": configs}
            for job, configs in static_configs.items()
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    with open(tmp / "prometheus.log", "w") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while True:
                if process.poll() is not None:
                    pytest.fail(f"prometheus exited with {process.returncode}: {(tmp / 'prometheus.log').read_text()}")
                try:
                    with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as response:
                        if response.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail("prometheus did not become ready in 30 s")
                time.sleep(0.2)
            yield Scrape(url, live, live_failure)
        finally:
            _stop(process)
            stop.set()
            for thread in threads:
                thread.join(timeout=35)
            if live is not None:
                live.close()
            for server in servers:
                server.shutdown()
                server.server_close()


def query(url: str, expr: str) -> dict:
    """GET /api/v1/query; returns the JSON body whether Prometheus accepted the query or not."""
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}", timeout=10) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:  # 400 bad_data carries the parse error in its body
        return json.load(e)


def _values(body: dict) -> list[float]:
    return [float(sample["value"][1]) for sample in body["data"]["result"]]


def _wait_for_data(url: str, queries: set[tuple[str, str, str]], timeout_s: float) -> tuple[dict, set]:
    """Poll each query until it returns finite samples; (answers, queries still without data)."""
    pending, answers = set(queries), {}
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        for item in sorted(pending):
            body = query(url, item[2])
            assert body["status"] == "success", f"{item[0]} / {item[1]}: {body.get('error')}"
            values = _values(body)
            if values and all(math.isfinite(v) for v in values):
                answers[item] = values
                pending.discard(item)
        if pending:
            time.sleep(1)
    return answers, pending


def _queries(namespace: str) -> set[tuple[str, str, str]]:
    boards = dashboards()
    return {
        (d, title, substitute(expr, boards[d], RATE_WINDOW).replace('namespace=~".*"', f'namespace="{namespace}"'))
        for d, title, expr in dashboard_queries()
    }


def test_every_dashboard_query_returns_data(prometheus):
    answers, pending = _wait_for_data(prometheus.url, _queries(NAMESPACE), 45)
    assert not pending, "queries without data:\n" + "\n".join(f"{d} / {t}: {e}" for d, t, e in sorted(pending))
    by_title = {title: values for (_, title, _), values in answers.items()}
    # Sanity of what the panels show, given the synthetic traffic.
    assert 0 < by_title["Acceptance rate"][0] <= 1
    assert 1 <= by_title["Mean acceptance length"][0] <= 8
    assert len(by_title["Acceptance by draft position"]) == 7  # one bar per draft position
    assert 0 < by_title["Error ratio"][0] < 0.5
    assert len(by_title["Request rate per worker"]) == len(WORKERS)
    assert by_title["Healthy workers"] == [len(WORKERS)]


def test_dashboards_show_the_running_service(prometheus):
    """The gateway's panels fill from the real service; so do the workers' own once their names survive the scrape."""
    assert prometheus.live.processes  # the running service (a failure on CI, a skip elsewhere, when absent)
    # Error, retry and 429/503 panels have no series until something fails, and the stub never does; the
    # cluster exporters' series (GPUs, restarts, Triton) are not the service's.
    queries = {
        q
        for q in _queries("live")
        if not any(t in q[1] for t in ("Error ratio", "Retries", "429"))
        and not metric_names(q[2]) & set(EXTERNAL_METRICS)
    }
    answers, pending = _wait_for_data(prometheus.url, queries, 90)  # 2 shared cores: be patient
    assert not pending, "panels without data:\n" + "\n".join(f"{d} / {t}: {e}" for d, t, e in sorted(pending))
    by_title = {title: values for (_, title, _), values in answers.items()}
    assert by_title["Healthy workers"] == [1]
    assert 0 <= by_title["Acceptance rate"][0] <= 1
    assert by_title["Acceptance by draft position"]  # the worker's own series (`worker=""`) arrive too


def test_helm_test_script_passes_against_the_running_gateway(prometheus):
    """The `helm test` pod's script, taken from the rendered chart, run against the real gateway."""
    assert prometheus.live.processes  # the running service (a failure on CI, a skip elsewhere, when absent)
    from tests.helm.conftest import one, render

    pod = one(render(), "Pod")
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    keys, wrong = prometheus.live.log_dir / "api-keys", prometheus.live.log_dir / "wrong-keys"
    keys.write_text(API_KEY + "\n")  # the mounted Secret file
    wrong.write_text("sk-wrong\n")
    env |= {"DEEPSPEC_URL": prometheus.live.url, "DEEPSPEC_API_KEYS_FILE": str(keys)}
    result = subprocess.run(
        [sys.executable, "-c", container["args"][0]],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "completion:" in result.stdout
    wrong_key = subprocess.run(
        [sys.executable, "-c", container["args"][0]],
        env={**os.environ, **env, "DEEPSPEC_API_KEYS_FILE": str(wrong)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert wrong_key.returncode != 0  # the gateway enforces the key the pod reads from the Secret


def test_every_alert_expression_evaluates(prometheus):
    for alert, expr in rule_exprs():
        body = query(prometheus.url, expr)
        assert body["status"] == "success", f"{alert}: {body.get('error')}"


def test_a_broken_query_is_reported(prometheus):
    """The checks above would notice a parse error: Prometheus answers it with status error."""
    body = query(prometheus.url, "sum by (le (rate(deepspec:time_to_first_token_seconds_bucket[5m]))")
    assert body["status"] == "error" and body["errorType"] == "bad_data"


def test_the_real_worker_endpoint_keeps_deepspec_names(prometheus):
    """Prometheus 2.x asks for OpenMetrics first, and prometheus_client's OpenMetrics writer turns `deepspec:x` into
    `deepspec_x` in sample lines: every dashboard and alert would miss such series. The service must keep answering
    with the classic text format."""
    assert prometheus.live.processes  # the running service (a failure on CI, a skip elsewhere, when absent)
    names: set[str] = set()
    deadline = time.monotonic() + 30
    while not names and time.monotonic() < deadline:
        body = query(prometheus.url, 'count by (__name__) ({job="live-worker", __name__=~"deepspec.*"})')
        names = {sample["metric"]["__name__"] for sample in body["data"]["result"]}
        time.sleep(0.5)
    assert names, "Prometheus stored nothing from the worker"
    escaped = sorted(name for name in names if ":" not in name)  # the writer escapes every colon (our recording
    # rules' own `deepspec_engine:` copies of the worker's series keep theirs)
    assert not escaped, f"the worker's /metrics escaped names for Prometheus: {escaped[:3]}..."


def test_a_service_that_did_not_start_fails_on_ci_and_skips_elsewhere(monkeypatch):
    scrape = Scrape("http://127.0.0.1:9", None, "--- gateway.log\nthe HTTP server did not start")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="did not start"):
        scrape.live  # noqa: B018  (reading the property is the test)
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        scrape.live  # noqa: B018  (reading the property is the test)


ENGINE_BOARD = "deepspec-engine"


@pytest.mark.parametrize("runtime", sorted(engine_metrics.RUNTIMES))
def test_engine_dashboard_shows_each_runtime(prometheus, runtime):
    """Every Engine panel has data for every runtime, read from that engine's own metric names through the recording
    rules, and shows what the recorded engine holds: acceptance 0.7 over 3.1 tokens a round (DeepSpec's worker 0.75
    and 3.25), 3 requests waiting and 6 running."""
    # what the runtime's pinned engine does not emit (engine_metrics.MISSING) has no panel data, by design
    recorded = {r["record"] for r in engine_metrics.recording_rules(runtime)}
    absent = {
        name
        for name in ("num_requests_waiting", "spec_decode_acceptance_rate", "spec_decode_mean_acceptance")
        if not any(name in r for r in recorded)
    }
    queries = {
        q
        for q in _queries(_engine_namespace(runtime))
        if q[0] == ENGINE_BOARD and not any(name in q[2] for name in absent)
    }
    assert len(queries) >= 9 - len(absent)
    answers, pending = _wait_for_data(prometheus.url, queries, 45)
    assert not pending, "panels without data:\n" + "\n".join(f"{t}: {e}" for _, t, e in sorted(pending))
    by_title = {(title, expr.count("num_requests_running")): values for (_, title, expr), values in answers.items()}
    rate, length = (0.75, 3.25) if runtime == "deepspec" else (0.7, 3.1)
    if "spec_decode_acceptance_rate" not in absent:
        assert by_title[("Engine acceptance rate", 0)] == pytest.approx([rate], abs=1e-6)
        assert by_title[("Engine mean acceptance length", 0)] == pytest.approx([length], abs=1e-6)
    if "num_requests_waiting" not in absent:
        assert by_title[("Engine requests waiting and running", 0)] == [3]
    assert by_title[("Engine requests waiting and running", 1)] == [6]
