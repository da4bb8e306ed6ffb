"""A real Prometheus (Debian's `prometheus`) scrapes a gateway and a worker and answers every dashboard query.

The gateway and worker here are their real metric objects (`service.metrics.GatewayMetrics` / `WorkerMetrics`),
served the way the gateway's `/metrics` route serves them (`generate_latest`, text format) and fed synthetic traffic
by a thread, so the label sets, histogram buckets and counter suffixes Prometheus sees are exactly the service's.
Both are scraped every second under the job names the chart's ServiceMonitors produce. A real stub worker
(`python -m service worker --target stub`) is scraped beside them, to check that names survive its own endpoint.
"""

from __future__ import annotations

import http.server
import json
import math
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
import yaml

from service.metrics import GatewayMetrics, WorkerMetrics
from tests.helm.conftest import NAMESPACE, RELEASE, REPO, require_tool
from tests.helm.promql import dashboard_queries, dashboards, rule_exprs, substitute

pytestmark = pytest.mark.integration

MODEL = "smollm2-135m"
WORKERS = ("10.0.0.7:8001", "10.0.0.8:8001")
RATE_WINDOW = "10s"  # Grafana would send $__rate_interval = 4 x the 1 s scrape interval at least


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _traffic(gateway: GatewayMetrics, worker: WorkerMetrics, stop: threading.Event) -> None:
    """A few hundred requests a second, spread over two workers, with drafts mostly accepted."""
    rng = random.Random(0)
    while not stop.is_set():
        now = time.perf_counter()
        for name in WORKERS:
            labels = (MODEL, name)
            status = rng.choices(["stop", "length", "error"], weights=[80, 15, 5])[0]
            ttft = rng.uniform(0.02, 0.4)
            gateway.time_to_first_token.labels(*labels).observe(ttft)
            gateway.inter_token_latency.labels(*labels).observe(rng.uniform(0.005, 0.05))
            gateway.observe_request(labels, status=status, arrival=now - 1.0, first_token=now - 1.0 + ttft,
                                    finished=now, num_prompt_tokens=rng.randint(10, 200),
                                    num_output_tokens=rng.randint(2, 64))
            num_draft, num_accepted = 7, rng.randint(0, 7)
            gateway.spec_decode_num_drafts.labels(*labels).inc()
            gateway.spec_decode_num_draft_tokens.labels(*labels).inc(num_draft)
            gateway.spec_decode_num_accepted_tokens.labels(*labels).inc(num_accepted)
            gateway.num_requests_outstanding.labels(name).set(rng.randint(0, 8))
            gateway.worker_healthy.labels(name).set(1)
            if rng.random() < 0.05:
                gateway.retries.labels(name).inc()
        worker.observe_request((MODEL,), status="stop", arrival=now - 1.0, first_token=now - 0.9, finished=now,
                               num_prompt_tokens=50, num_output_tokens=20)
        worker.time_to_first_token.labels(MODEL).observe(0.1)
        worker.request_queue_time.labels(MODEL).observe(rng.uniform(0.0, 0.2))
        worker.observe_spec_round(num_draft_tokens=7, num_accepted_tokens=rng.randint(0, 7))
        worker.num_requests_running.labels(MODEL).set(rng.randint(1, 8))
        worker.num_requests_waiting.labels(MODEL).set(rng.randint(0, 4))
        stop.wait(0.02)


def _serve(registry) -> http.server.ThreadingHTTPServer:
    """`/metrics` as service/gateway/routers/health.py serves it: always the text format."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
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


def _start_stub_worker(metrics_port: int) -> subprocess.Popen | None:
    """The real worker on its fake engine; None when this checkout's worker cannot start."""
    process = subprocess.Popen([sys.executable, "-m", "service", "worker", "--target", "stub", "--port", "0",
                                "--metrics-port", str(metrics_port), "--host", "127.0.0.1", "--drain-timeout-s", "0"],
                               cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.poll() is None:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=1).close()
            return process
        except OSError:
            time.sleep(0.3)
    _stop(process)
    return None


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    binary = require_tool("prometheus")
    gateway, worker = GatewayMetrics(), WorkerMetrics(MODEL)
    servers = [_serve(m.registry) for m in (gateway, worker)]
    stop = threading.Event()
    feeder = threading.Thread(target=_traffic, args=(gateway, worker, stop), daemon=True)
    feeder.start()
    stub_port = _free_port()
    stub = _start_stub_worker(stub_port)

    tmp = tmp_path_factory.mktemp("prometheus")
    jobs = {f"{RELEASE}-gateway": servers[0].server_port, f"{RELEASE}-worker": servers[1].server_port}
    if stub is not None:
        jobs["stub-worker"] = stub_port
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "scrape_configs": [{"job_name": job, "static_configs": [
                  {"targets": [f"127.0.0.1:{port}"], "labels": {"namespace": NAMESPACE}}]}
                  for job, port in jobs.items()]}
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = _free_port()
    log = open(tmp / "prometheus.log", "w")
    process = subprocess.Popen([binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
                                f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                               stdout=log, stderr=subprocess.STDOUT)
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
        yield url, stub is not None
    finally:
        _stop(process)
        log.close()
        if stub is not None:
            _stop(stub)
        stop.set()
        feeder.join(timeout=5)
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


def test_every_dashboard_query_returns_data(prometheus):
    prometheus, _ = prometheus
    boards = dashboards()
    pending = {(d, title, substitute(expr, boards[d], RATE_WINDOW)) for d, title, expr in dashboard_queries()}
    answers: dict = {}
    deadline = time.monotonic() + 45
    while pending and time.monotonic() < deadline:
        for item in sorted(pending):
            body = query(prometheus, item[2])
            assert body["status"] == "success", f"{item[0]} / {item[1]}: {body.get('error')}"
            values = _values(body)
            if values and all(math.isfinite(v) for v in values):
                answers[item] = values
                pending.discard(item)
        time.sleep(1)
    assert not pending, "queries without data:\n" + "\n".join(f"{d} / {t}: {e}" for d, t, e in sorted(pending))
    by_title = {title: values for (_, title, _), values in answers.items()}
    # Sanity of what the panels show, given the synthetic traffic.
    assert 0 < by_title["Acceptance rate"][0] <= 1
    assert 1 <= by_title["Mean acceptance length"][0] <= 8
    assert len(by_title["Acceptance by draft position"]) == 7  # one bar per draft position
    assert 0 < by_title["Error ratio"][0] < 0.5
    assert len(by_title["Request rate per worker"]) == len(WORKERS)
    assert by_title["Healthy workers"] == [len(WORKERS)]


def test_every_alert_expression_evaluates(prometheus):
    prometheus, _ = prometheus
    for alert, expr in rule_exprs():
        body = query(prometheus, expr)
        assert body["status"] == "success", f"{alert}: {body.get('error')}"


def test_a_broken_query_is_reported(prometheus):
    """The checks above would notice a parse error: Prometheus answers it with status error."""
    prometheus, _ = prometheus
    body = query(prometheus, "sum by (le (rate(deepspec:time_to_first_token_seconds_bucket[5m]))")
    assert body["status"] == "error" and body["errorType"] == "bad_data"


def test_the_real_worker_endpoint_keeps_deepspec_names(prometheus):
    """Prometheus 2.x asks for OpenMetrics first; prometheus_client's OpenMetrics writer (what
    `start_http_server` answers with) turns `deepspec:x` into `deepspec_x` in sample lines, and every dashboard and
    alert would then miss the worker's series. The gateway's route always sends the text format and is safe."""
    prometheus, stub_running = prometheus
    if not stub_running:
        pytest.skip("`python -m service worker --target stub` did not start in this checkout")
    names: set[str] = set()
    deadline = time.monotonic() + 30
    while not names and time.monotonic() < deadline:
        body = query(prometheus, 'count by (__name__) ({job="stub-worker", __name__=~"deepspec.*"})')
        names = {sample["metric"]["__name__"] for sample in body["data"]["result"]}
        time.sleep(0.5)
    assert names, "Prometheus stored nothing from the stub worker"
    if not any(name.startswith("deepspec:") for name in names):
        pytest.xfail("the worker's /metrics (prometheus_client.start_http_server) answers Prometheus 2.x's "
                     f"OpenMetrics request with escaped names: {sorted(names)[:3]}...; serve generate_latest "
                     "(text format) as the gateway does")
    assert all(name.startswith("deepspec:") for name in names), sorted(names)
