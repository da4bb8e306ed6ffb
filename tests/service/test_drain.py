"""Shutdown and outages as the Helm chart runs the gateway (`--drain-timeout-s`, `--ready-without-workers`,
`--metrics-port`): SIGTERM with streams in flight cuts none of them inside the drain budget, a gateway with no
worker stays Ready and answers 503 + Retry-After, and /metrics lives on its own port only."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.service.conftest import Gateway, Worker, free_port, metric_value

pytestmark = pytest.mark.integration

DRAIN_S = 60  # the budget under test; each stream needs a few seconds of it (more on loaded shared cores)
MAX_TOKENS = 600  # at 20 ms a step (several tokens each, drafts accepted) a stream lasts seconds, not a blink


def _stream(url: str, max_tokens: int, out: dict, ended: dict, key: int) -> None:
    """One SSE completion to the end; records its status, finish reason, usage and whether [DONE] arrived."""
    body = {"prompt": "x", "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}}
    record = {"status": None, "finish": None, "tokens": None, "done": False, "error": None}
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
            record["status"] = response.status_code
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    record["done"] = True
                    continue
                event = json.loads(line[len("data: ") :])
                if "error" in event:
                    record["error"] = event["error"]
                for choice in event.get("choices", []):
                    record["finish"] = choice.get("finish_reason") or record["finish"]
                if event.get("usage"):
                    record["tokens"] = event["usage"]["completion_tokens"]
    except httpx.HTTPError as e:
        record["error"] = repr(e)
    out[key], ended[key] = record, time.monotonic()


def _running(worker: Worker) -> float:
    try:
        return metric_value(worker.metrics(), "deepspec:num_requests_running")
    except httpx.HTTPError:
        return -1


def _wait_for(predicate, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_sigterm_finishes_every_stream_in_flight_inside_the_drain_budget(tmp_path):
    worker = Worker(tmp_path, "--stub-step-ms", "20", "--max-batch-size", "8").start().wait_ready()
    gw = Gateway(tmp_path, worker.address, "--drain-timeout-s", str(DRAIN_S), "--ready-without-workers").start()
    gw.wait_ready()
    try:
        results: dict[int, dict] = {}
        ended: dict[int, float] = {}
        threads = [threading.Thread(target=_stream, args=(gw.url, MAX_TOKENS, results, ended, i)) for i in range(4)]
        for t in threads:
            t.start()
        _wait_for(lambda: _running(worker) == 4)  # all four are streaming from the worker
        t0 = time.monotonic()
        gw.process.send_signal(15)
        # Draining: readiness drops (the Service stops sending new requests) and newcomers get 503 + Retry-After.
        _wait_for(lambda: httpx.get(f"{gw.url}/health/ready").status_code == 503, 5)
        refused = httpx.post(f"{gw.url}/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["error"]["type"] == "service_unavailable"
        for t in threads:
            t.join(DRAIN_S + 10)
        assert gw.process.wait(DRAIN_S + 10) == 0
        elapsed = time.monotonic() - t0
        assert min(ended.values()) > t0  # every stream was still in flight when SIGTERM came
        # Nothing cut: every stream ran to its max_tokens, sent its usage and [DONE], with no error event.
        assert results == {
            i: {"status": 200, "finish": "length", "tokens": MAX_TOKENS, "done": True, "error": None} for i in range(4)
        }
        assert elapsed < DRAIN_S  # the gateway left as soon as its streams were done, inside the budget
    finally:
        gw.terminate()
        worker.terminate()


def test_gateway_without_workers_stays_ready_and_answers_503_with_retry_after(tmp_path):
    nowhere = f"127.0.0.1:{free_port()}"  # nothing listens: the worker is down
    metrics_port = free_port()
    gw = Gateway(tmp_path, nowhere, "--ready-without-workers", "--metrics-port", str(metrics_port)).start()
    try:
        gw.wait_ready()  # Ready although no worker is admitted: it stays in its Service
        assert httpx.get(f"{gw.url}/health/ready").json() == {"status": "ready", "workers": 0}
        for _ in range(3):  # and keeps answering, with a delay to retry after
            r = httpx.post(f"{gw.url}/v1/completions", json={"prompt": "x", "max_tokens": 2})
            assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
            assert r.json()["error"]["type"] == "service_unavailable"
        # /metrics only on its own port: never next to the API an Ingress routes.
        assert httpx.get(f"{gw.url}/metrics").status_code == 404
        scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics")
        assert scraped.status_code == 200 and "deepspec:gateway_worker_healthy" in scraped.text
    finally:
        gw.terminate()
    # Without the flag the gateway reports not-ready while no worker is admitted (the local default).
    plain = Gateway(tmp_path, nowhere).start()
    try:
        plain.wait_until(lambda: httpx.get(f"{plain.url}/health/live", timeout=1).status_code == 200, 30)
        time.sleep(0.5)
        ready = httpx.get(f"{plain.url}/health/ready")
        assert ready.status_code == 503 and ready.json()["reason"] == "no ready worker"
        assert httpx.get(f"{plain.url}/metrics").status_code == 200
    finally:
        plain.terminate()
