"""The stack in real containers (tests/e2e/stack.py): the gateway, two CPU workers and Prometheus on a Docker
network, driven with the `openai` client and `python -m loadtest` through the gateway's published port.

The tests run in file order on one stack: the fault checks leave the workers restarted and healthy, and Prometheus
is asked last, so the rate windows of its queries hold everything before (the kill's failed streams too).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e import monitoring
from tests.e2e.conftest import API_KEY, REPO
from tests.e2e.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

MAX_TOKENS = 32
STREAMS = 8  # one worker's batch (--max-batch-size 8): no stream waits for a slot, wherever they land
LONG_STREAM_TOKENS = 2000  # mid-stream when a worker dies (one stream alone decodes ~50 tokens/s); ignore_eos
DRAIN_GRACE_S = 60  # the grace docker stop gives a worker (the chart's terminationGracePeriodSeconds does as much)
WORKER_TIMEOUT_S = float(os.environ.get("DEEPSPEC_E2E_WORKER_TIMEOUT_S", "900"))


def _client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.gateway_url}/v1", api_key=API_KEY, max_retries=0, timeout=300)


def _model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def _chat(client: openai.OpenAI, model: str, prompt: str, **kwargs):
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], temperature=0, **kwargs
    )


def _in_flight(stack: Stack, worker: str) -> int:
    """Requests the worker holds (running + waiting), read from its own /metrics."""
    with urllib.request.urlopen(stack.metrics_url(worker), timeout=10) as response:
        text = response.read().decode()
    names = ("deepspec:num_requests_running", "deepspec:num_requests_waiting")
    return round(
        sum(s.value for family in text_string_to_metric_families(text) for s in family.samples if s.name in names)
    )


def _held_streams(stack: Stack, expected: int, timeout_s: float = 15) -> dict[str, int]:
    """Each worker's in-flight requests, once they add up to `expected` (a gauge moves a step after a stream starts)."""
    deadline = time.monotonic() + timeout_s
    while True:
        held = {worker: _in_flight(stack, worker) for worker in stack.workers}
        if sum(held.values()) == expected or time.monotonic() > deadline:
            return held
        time.sleep(0.5)


def _routing_state(stack: Stack) -> str:
    """The gateway's view of its workers (admitted, outstanding) and every container's last log lines: what a
    failure message needs to tell a routing fault from a worker's."""
    try:
        with urllib.request.urlopen(stack.metrics_url(stack.gateway), timeout=10) as response:
            wanted = ("deepspec:gateway_worker_healthy", "deepspec:gateway_num_requests_outstanding")
            lines = [line for line in response.read().decode().splitlines() if line.startswith(wanted)]
    except OSError as e:
        lines = [f"the gateway's metrics did not answer: {e}"]
    return "\n".join(lines) + "\n" + stack.diagnostics()


def _loadtest(stack: Stack, out: Path, *args: str) -> dict:
    """`python -m loadtest` against the gateway, its spec-decode counters read from the gateway's metrics port."""
    command = [
        sys.executable,
        "-m",
        "loadtest",
        "--base-url",
        stack.gateway_url,
        "--api-key",
        API_KEY,
        "--metrics-url",
        stack.metrics_url(stack.gateway),
        "--max-tokens",
        str(MAX_TOKENS),
        "--quiet",
        "--result-file",
        str(out),
        *args,
    ]
    result = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    output = f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert result.returncode == 0, f"loadtest exited {result.returncode}:\n{output}"
    return json.loads(out.read_text())


def test_the_openai_client_gets_completions_through_the_gateway(stack):
    client = _client(stack)
    model = _model(client)
    chat = _chat(client, model, "Name three colours.", max_tokens=MAX_TOKENS)
    assert chat.choices[0].message.content and chat.usage.completion_tokens > 0
    prompt = "def fibonacci(n):"
    streamed = "".join(
        chunk.choices[0].text
        for chunk in client.completions.create(
            model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True
        )
        if chunk.choices
    )
    whole = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
    assert streamed and streamed == whole.choices[0].text  # greedy: the same text streamed or not, on either worker


def test_loadtest_runs_through_the_gateway_with_speculation(stack, tmp_path):
    report = _loadtest(
        stack, tmp_path / "load.json", "--backend", "openai-chat", "--num-prompts", "16", "--max-concurrency", "4"
    )
    assert (report["completed"], report["failed"]) == (16, 0), report["errors_by_kind"]
    assert report["spec_decode"] and report["spec_decode"]["num_draft_tokens"] > 0  # the workers speculate


class _Streams:
    """`n` long completion streams in threads; each records ("ok", "<finish reason>: <text>") or ("error", what the
    client raised)."""

    def __init__(self, client: openai.OpenAI, model: str, n: int):
        self.results: list[tuple[str, str] | None] = [None] * n
        self.first_tokens = [threading.Event() for _ in range(n)]
        self.threads = [threading.Thread(target=self._stream, args=(client, model, i), daemon=True) for i in range(n)]
        for thread in self.threads:
            thread.start()

    def _stream(self, client: openai.OpenAI, model: str, i: int) -> None:
        text, finish = "", None
        try:
            # a prompt of its own each: no shared prefix (a chat template's system prompt would be one), so the
            # gateway's prefix affinity does not hold them all on one worker
            for chunk in client.completions.create(
                model=model,
                prompt=f"{i}. Once upon a time, a lighthouse keeper",
                max_tokens=LONG_STREAM_TOKENS,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            ):
                if chunk.choices and chunk.choices[0].text:
                    text += chunk.choices[0].text
                    self.first_tokens[i].set()
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
            self.results[i] = ("ok", f"{finish}: {text}")
        except Exception as e:
            self.results[i] = ("error", repr(e))
        finally:
            self.first_tokens[i].set()

    def wait_first_tokens(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        return all(event.wait(max(0.0, deadline - time.monotonic())) for event in self.first_tokens)

    def join(self, timeout_s: float) -> list[tuple[str, str] | None]:
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return self.results


def test_a_killed_worker_costs_only_its_own_streams(stack):
    client = _client(stack)
    model = _model(client)
    # The burst is sent while both workers' load reports from the test before are fresh: the goodput scorer itself
    # must spread it (service/gateway/scoring.py compares rates at the rows each worker would run)
    streams = _Streams(client, model, n=STREAMS)
    _held_streams(stack, STREAMS, timeout_s=300)  # every stream admitted to a worker's batch or queue
    assert streams.wait_first_tokens(300), "not every stream had its first token in 300 s"
    held = _held_streams(stack, STREAMS)  # none finished yet: each is far from its max_tokens
    early = [r[1] for r in streams.results if r is not None and r[0] == "error"]
    assert not early, f"streams failed before any worker was killed: {early}\n{_routing_state(stack)}"
    victim = max(held, key=lambda worker: held[worker])
    assert 0 < held[victim] < sum(held.values()) == STREAMS, (
        f"the streams are not spread over both workers: {held}\n{_routing_state(stack)}"
    )
    stack.kill(victim)
    results = [result for result in streams.join(600) if result is not None]
    assert len(results) == STREAMS, "a stream did not end in 600 s"
    failed = [detail for status, detail in results if status == "error"]
    assert len(failed) == held[victim], (
        f"{len(failed)} streams failed, {held[victim]} were on {victim}: {results}\n{_routing_state(stack)}"
    )
    assert all(detail.startswith("length: ") for status, detail in results if status == "ok")  # all its tokens
    for i in range(4):  # the next requests go to the survivor and succeed
        assert _chat(client, model, f"After the crash {i}: say hello.", max_tokens=8).choices[0].message.content
    stack.restart_after_stop(victim, WORKER_TIMEOUT_S)


def test_a_rolling_restart_under_load_fails_no_request(stack, tmp_path):
    """Each worker in turn gets SIGTERM (it drains), comes back and turns healthy, while loadtest runs in rounds of
    20 s at 2 requests/s; every round's every request must succeed."""
    reports, done, errors = [], threading.Event(), []

    def load():
        rounds = 0
        while not done.is_set() or rounds == 0:
            try:
                reports.append(
                    _loadtest(
                        stack,
                        tmp_path / f"round-{rounds}.json",
                        "--backend",
                        "openai-chat",
                        "--request-rate",
                        "2",
                        "--duration",
                        "20",
                        "--seed",
                        str(rounds),
                        "--save-detailed",
                    )
                )
            except AssertionError as e:
                errors.append(str(e))
            rounds += 1

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    try:
        time.sleep(10)
        for worker in stack.workers:
            stack.stop(worker, DRAIN_GRACE_S)
            stack.restart_after_stop(worker, WORKER_TIMEOUT_S)
            time.sleep(5)  # the gateway's DNS refresh and health checks admit it again
    finally:
        done.set()
        thread.join(timeout=300)
    assert not errors, errors
    failed = sum(r["failed"] for r in reports)
    assert reports and failed == 0, (
        f"{[(r['date'], sorted(set(r['errors']) - {''})) for r in reports if r['failed']]}\n{_routing_state(stack)}"
    )
    assert sum(r["completed"] for r in reports) > 0


def _query(stack: Stack, expr: str) -> dict:
    url = f"{stack.prometheus_url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.load(response)
    except urllib.error.HTTPError as e:  # 400 bad_data carries the parse error in its body
        return json.load(e)


def test_prometheus_scrapes_every_container(stack):
    body = _query(stack, "up")
    assert body["status"] == "success", body
    up = {(s["metric"]["job"], s["metric"]["instance"]): s["value"][1] for s in body["data"]["result"]}
    jobs = sorted(job for job, _ in up)
    assert jobs == ["deepspec-gateway", "deepspec-worker", "deepspec-worker", "prometheus"], up
    assert set(up.values()) == {"1"}, up


def test_every_dashboard_and_keda_query_returns_data(stack):
    expected, _ = monitoring.panel_queries()
    pending, answers = expected | monitoring.keda_queries(), {}
    deadline = time.monotonic() + 120
    while pending and time.monotonic() < deadline:
        for item in sorted(pending):
            body = _query(stack, item[2])
            assert body["status"] == "success", f"{item[0]} / {item[1]}: {body.get('error')}"
            if body["data"]["result"]:
                answers[item] = body["data"]["result"]
                pending.discard(item)
        if pending:
            time.sleep(2)
    assert not pending, "queries without data:\n" + "\n".join(f"{d} / {t}: {e}" for d, t, e in sorted(pending))
    healthy = next(r for (_, title, _), r in answers.items() if title == "Healthy workers")
    assert healthy[0]["value"][1] == "2"
