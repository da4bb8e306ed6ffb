"""Faults with real processes: a worker dies mid-stream, overload, client disconnects, SIGTERM drain."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from tests.service.conftest import Gateway, Worker, metric_value

pytestmark = pytest.mark.integration


def wait_for(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def running(worker: Worker) -> float:
    try:
        return metric_value(worker.metrics(), "deepspec:num_requests_running")
    except httpx.HTTPError:
        return -1


def healthy(gw: Gateway, worker: Worker) -> float:
    return metric_value(httpx.get(f"{gw.url}/metrics").text, "deepspec:gateway_worker_healthy", worker=worker.address)


def test_worker_killed_mid_stream(tmp_path):
    a = Worker(tmp_path, "--stub-step-ms", "10", name="a").start()
    b = Worker(tmp_path, "--stub-step-ms", "10", name="b").start()
    a.wait_ready()
    b.wait_ready()
    gw = Gateway(tmp_path, f"{a.address},{b.address}").start().wait_ready()
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0)
    try:
        wait_for(lambda: healthy(gw, a) == 1 and healthy(gw, b) == 1)
        streams = [client.completions.create(model="stub", prompt="Hi", max_tokens=300, stream=True) for _ in range(4)]
        for s in streams:
            next(iter(s))
        victims = a if running(a) > 0 else b
        victims.kill()
        outcomes = []
        for s in streams:
            try:
                outcomes.append("".join(c.choices[0].text for c in s))
            except openai.APIError as e:  # the error event inside the stream
                outcomes.append(e)
        errors = [o for o in outcomes if isinstance(o, Exception)]
        assert errors, "a client of the killed worker must see an error"
        assert all("worker failed mid-generation" in str(e) for e in errors)
        # new requests go to the survivor, the dead one is ejected
        for _ in range(4):
            assert client.completions.create(model="stub", prompt="x", max_tokens=3).choices[0].text == "The"
        wait_for(lambda: healthy(gw, victims) == 0)
        assert (
            metric_value(
                httpx.get(f"{gw.url}/metrics").text,
                "deepspec:request_success_total",
                worker=victims.address,
                status="length",
            )
            == 0
        )
        # restarted on the same port: re-admitted
        restarted = Worker(tmp_path, "--stub-step-ms", "10", port=victims.port, name="restarted").start().wait_ready()
        try:
            wait_for(lambda: healthy(gw, restarted) == 1)
            before = metric_value(restarted.metrics(), "deepspec:request_success_total")
            for _ in range(12):
                client.completions.create(model="stub", prompt="x", max_tokens=2)
            assert metric_value(restarted.metrics(), "deepspec:request_success_total") > before
        finally:
            restarted.terminate()
    finally:
        gw.terminate()
        for w in (a, b):
            w.kill()


def _flood(url: str, num_requests: int) -> list[httpx.Response]:
    """`num_requests` completions at once; every thread must finish within 30 s (nothing hangs)."""
    results: list[httpx.Response] = []

    def call():
        results.append(httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 40}, timeout=30))

    threads = [threading.Thread(target=call) for _ in range(num_requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    return results


def test_overload_waits_in_the_gateways_queue_instead_of_429(tmp_path):
    """A worker with one slot and one queue place, eight requests at once: the worker refuses six as saturated,
    and instead of answering them 429 the gateway holds them in its admission queue and sends each as a slot frees."""
    worker = Worker(tmp_path, "--stub-step-ms", "20", "--max-batch-size", "1", "--max-queue", "1").start().wait_ready()
    gw = Gateway(tmp_path, worker.address).start().wait_ready()
    try:
        assert [r.status_code for r in _flood(gw.url, 8)] == [200] * 8
    finally:
        gw.terminate()
        worker.terminate()


def test_overload_past_the_queue_is_429_with_retry_after_and_a_drop_reason(tmp_path):
    worker = Worker(tmp_path, "--stub-step-ms", "20", "--max-batch-size", "1", "--max-queue", "1").start().wait_ready()
    gw = Gateway(tmp_path, worker.address, env={"DEEPSPEC_GATEWAY_MAX_WAITING": "1"}).start().wait_ready()
    try:
        results = _flood(gw.url, 8)
        statuses = [r.status_code for r in results]
        assert statuses.count(200) >= 3 and statuses.count(429) >= 1 and set(statuses) <= {200, 429}
        for r in results:
            if r.status_code == 429:
                assert r.headers["retry-after"] == "1" and r.json()["error"]["type"] == "rate_limit_error"
                assert r.headers["x-deepspec-drop-reason"] == r.json()["error"]["code"] == "queue_full"
        assert httpx.post(f"{gw.url}/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
    finally:
        gw.terminate()
        worker.terminate()


@pytest.mark.parametrize("stream", [True, False])
def test_http_disconnect_frees_the_worker_slot(tmp_path, stream):
    worker = Worker(tmp_path, "--stub-step-ms", "20", "--max-batch-size", "1").start().wait_ready()
    gw = Gateway(tmp_path, worker.address).start().wait_ready()
    try:
        with httpx.Client(timeout=30) as client:
            body = {"prompt": "x", "max_tokens": 1500, "stream": stream}
            if stream:
                with client.stream("POST", f"{gw.url}/v1/completions", json=body) as response:
                    lines = response.iter_lines()  # keep a reference: a collected iterator closes the connection
                    next(lines)
                    assert running(worker) == 1
            else:
                t = threading.Thread(target=_post_and_drop, args=(f"{gw.url}/v1/completions", body))
                t.start()
                wait_for(lambda: running(worker) == 1)
                t.join(5)
        wait_for(lambda: running(worker) == 0, 5)
        assert metric_value(worker.metrics(), "deepspec:request_success_total", status="abort") == 1
        assert httpx.post(f"{gw.url}/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
    finally:
        gw.terminate()
        worker.terminate()


def _post_and_drop(url: str, body: dict) -> None:
    """Send a non-streaming request and close the connection while it runs."""
    try:
        httpx.post(url, json=body, timeout=httpx.Timeout(30, read=1.0))
    except httpx.ReadTimeout:
        pass


def test_sigterm_drains_in_flight_requests(tmp_path):
    worker = Worker(tmp_path, "--stub-step-ms", "10").start().wait_ready()
    gw = Gateway(tmp_path, worker.address).start().wait_ready()
    try:
        result = {}

        def long_request():
            r = httpx.post(f"{gw.url}/v1/completions", json={"prompt": "x", "max_tokens": 150}, timeout=30)
            result["status"], result["tokens"] = r.status_code, r.json()["usage"]["completion_tokens"]

        t = threading.Thread(target=long_request)
        t.start()
        wait_for(lambda: running(worker) == 1)
        gw.process.send_signal(15)
        wait_for(lambda: httpx.get(f"{gw.url}/health/ready").status_code == 503, 5)  # readiness false first
        assert httpx.post(f"{gw.url}/v1/completions", json={"prompt": "x"}).status_code == 503
        t.join(20)
        assert result == {"status": 200, "tokens": 150}
        assert gw.process.wait(10) == 0
    finally:
        gw.terminate()
        worker.terminate()


def test_request_timeout_is_504_or_an_error_event(tmp_path):
    worker = Worker(tmp_path, "--stub-step-ms", "20").start().wait_ready()
    gw = Gateway(tmp_path, worker.address, "--request-timeout-s", "0.5").start().wait_ready()
    try:
        t0 = time.monotonic()
        response = httpx.post(f"{gw.url}/v1/completions", json={"prompt": "x", "max_tokens": 1500}, timeout=10)
        assert response.status_code == 504 and response.json()["error"]["code"] == "timeout"
        assert time.monotonic() - t0 < 3
        with httpx.stream(
            "POST", f"{gw.url}/v1/completions", timeout=10, json={"prompt": "x", "max_tokens": 1500, "stream": True}
        ) as r:
            lines = [line for line in r.iter_lines() if line]
        assert '"timeout"' in lines[-2] and lines[-1] == "data: [DONE]"
        wait_for(lambda: running(worker) == 0, 5)
    finally:
        gw.terminate()
        worker.terminate()


def test_dns_discovery(tmp_path):
    worker = Worker(tmp_path).start().wait_ready()
    gw = Gateway(tmp_path, f"dns://localhost:{worker.port}").start().wait_ready()
    try:
        r = httpx.post(f"{gw.url}/v1/completions", json={"prompt": "x", "max_tokens": 3})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "The"
    finally:
        gw.terminate()
        worker.terminate()


def test_drain_timeout_cuts_streams_with_the_worker_failure_error(tmp_path):
    """Streams still running when the drain timeout runs out end as if their worker had failed: HTTP gets the same
    error event (then `[DONE]`), gRPC the same status, each saying why."""
    import json
    import signal

    import grpc

    from deepspec_protocol.protos.deepspec.v1 import completions_pb2 as pb
    from deepspec_protocol.protos.deepspec.v1 import completions_pb2_grpc as pb_grpc
    from service.gateway.dispatch import _to_service_error
    from service.gateway.worker_client import WorkerError

    worker_failed = _to_service_error(WorkerError("UNAVAILABLE", "killed"), started=True)
    worker = Worker(tmp_path, "--stub-step-ms", "20").start().wait_ready()
    gw = Gateway(tmp_path, worker.address, "--drain-timeout-s", "1").start().wait_ready()
    try:
        with (
            grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}") as channel,
            httpx.stream(
                "POST", f"{gw.url}/v1/completions", json={"prompt": "x", "max_tokens": 2000, "stream": True}, timeout=30
            ) as response,
        ):
            call = pb_grpc.CompletionsStub(channel).CompleteStream(pb.CompletionRequest(prompt="x", max_tokens=2000))
            next(call)
            lines = response.iter_lines()
            next(lines)
            gw.process.send_signal(signal.SIGTERM)
            events = [line for line in lines if line]
            with pytest.raises(grpc.RpcError) as info:
                list(call)
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2].removeprefix("data: "))["error"]
        assert (error["type"], error["code"]) == (worker_failed.type, worker_failed.code)
        assert "drain timeout (1 s) ran out" in error["message"]
        assert info.value.code() == worker_failed.grpc_status and "drain timeout" in (info.value.details() or "")
        assert gw.process.wait(15) == 0
    finally:
        gw.terminate()
        worker.terminate()
