"""A real Prometheus (Debian package `prometheus`) scrapes the gateway and the worker; PromQL sees TTFT."""

from __future__ import annotations

import subprocess
import time

import httpx
import pytest

from tests.ports import free_port
from tests.tools import require_tool

pytestmark = pytest.mark.integration


@pytest.fixture
def prometheus(gateway, stub_worker, tmp_path):
    port = free_port()
    config = tmp_path / "prometheus.yml"
    binary = require_tool("prometheus", how="`make system-deps` installs it from Debian")
    config.write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: gateway
    static_configs: [{{targets: ["127.0.0.1:{gateway.http_port}"]}}]
  - job_name: worker
    static_configs: [{{targets: ["127.0.0.1:{stub_worker.metrics_port}"]}}]
""")
    with open(tmp_path / "prometheus.log", "wb") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            pytest.fail((tmp_path / "prometheus.log").read_text()[-3000:])
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def query(url: str, promql: str) -> list:
    response = httpx.get(f"{url}/api/v1/query", params={"query": promql}).json()
    assert response["status"] == "success", response
    return response["data"]["result"]


def test_prometheus_scrapes_both_and_computes_ttft_quantiles(prometheus, gateway):
    ttft = "histogram_quantile(0.9, sum by (le, job) (rate(deepspec:time_to_first_token_seconds_bucket[20s])))"
    deadline = time.monotonic() + 40
    results = []
    while time.monotonic() < deadline:
        for _ in range(3):
            httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "Hello", "max_tokens": 8, "stream": True})
        results = [r for r in query(prometheus, ttft) if r["value"][1] not in ("NaN", "+Inf")]
        if {r["metric"]["job"] for r in results} == {"gateway", "worker"}:
            break
        time.sleep(1)
    assert {r["metric"]["job"] for r in results} == {"gateway", "worker"}, results
    for r in results:
        assert 0 < float(r["value"][1]) < 1.0
    up = {r["metric"]["job"]: r["value"][1] for r in query(prometheus, "up")}
    assert up == {"gateway": "1", "worker": "1"}
    acceptance = query(
        prometheus,
        "1 + sum(deepspec:spec_decode_num_accepted_tokens_total{job='worker'}) "
        "/ sum(deepspec:spec_decode_num_drafts_total{job='worker'})",
    )
    assert float(acceptance[0]["value"][1]) > 1
