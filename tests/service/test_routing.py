"""Routing by expected goodput (service/gateway/scoring.py, routing.py `WorkerPool.pick`): the score, session and
prefix affinity, the fail-open to power of two choices, and the load a worker reports with its responses."""

from __future__ import annotations

import random
from typing import cast

import httpx
import pytest

from deepspec_protocol.worker import WorkerLoad
from service.gateway.routing import Endpoint, WorkerPool
from service.gateway.scoring import LoadScore, _step_cost, expected_tokens_per_s, prefix_key
from service.gateway.worker_client import WorkerClient
from service.metrics import REQUEST_SUCCESS_TOTAL, GatewayMetrics
from tests.service.conftest import Gateway, Worker, metric_value, picked

FAST = WorkerLoad(num_running=2, num_waiting=0, num_slots=8, kv_utilization=0.1, row_tokens_per_s=100.0)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _pool(*loads: WorkerLoad | None, clock=None) -> WorkerPool:
    pool = WorkerPool(
        "",
        GatewayMetrics(),
        rng=random.Random(0),
        clock=clock or Clock(),
        load_max_age_s=5.0,
        make_client=lambda address: None,
    )
    for i, load in enumerate(loads):
        # no client: picking never calls a worker
        endpoint = pool.endpoints[f"w{i}"] = Endpoint(f"w{i}", cast(WorkerClient, None), healthy=True, models={"m": 0})
        if load is not None:
            pool.observe_load(endpoint, load)
    return pool


def test_the_score_is_the_tokens_per_second_a_request_would_get():
    # a free slot: a running row's rate, carried from the 2 rows it was measured at to 3
    assert expected_tokens_per_s(FAST, "standard", 0) == pytest.approx(100.0 * _step_cost(2) / _step_cost(3))
    full = WorkerLoad(num_running=8, num_waiting=8, num_slots=8, row_tokens_per_s=100.0)
    assert expected_tokens_per_s(full, "standard", 0) == pytest.approx(100.0 * 8 / (8 + 9))  # 8 wait, +1 past
    assert expected_tokens_per_s(FAST, "standard", 6) < expected_tokens_per_s(FAST, "standard", 0)  # sent since
    tau = WorkerLoad(num_slots=8, row_tokens_per_s=100.0, acceptance={"interactive": 3.0, "batch": 1.0})
    assert expected_tokens_per_s(tau, "interactive", 0) == 150.0 and expected_tokens_per_s(tau, "batch", 0) == 50.0
    assert expected_tokens_per_s(WorkerLoad(num_slots=8, row_tokens_per_s=100.0, kv_utilization=1.0), "batch", 0) == 0


def test_a_report_is_made_ready_to_score_when_it_arrives_not_on_every_pick(monkeypatch):
    """What a report's score needs beyond the request (the row rate in one-row steps, the class ratios, the KV
    headroom) is worked out once per report: a pick over n workers would otherwise redo it n times a request."""
    kv_full = WorkerLoad(
        num_running=1, num_slots=8, row_tokens_per_s=80.0, kv_utilization=0.95, acceptance={"batch": 2.0}
    )
    pool = _pool(FAST, kv_full)
    for endpoint, load in zip(pool.endpoints.values(), (FAST, kv_full)):
        assert endpoint.load is not None
        for service_class, sent in (("standard", 0), ("batch", 3)):
            assert endpoint.load.tokens_per_s(service_class, sent) == expected_tokens_per_s(load, service_class, sent)
    made = []
    monkeypatch.setattr(LoadScore, "of", lambda load: made.append(load))
    assert {picked(pool, "m") for _ in range(10)} == {"w0"}
    assert made == []


def test_a_burst_spreads_over_a_busy_and_an_idle_worker():
    """Rates reported at different batch sizes are compared at the rows each worker would run: the worker running
    one row (185 tok/s for it alone) and the idle one whose rate was last measured at 8 rows (77 tok/s each: the
    same CPU's AVX2 curve) share a burst about evenly; compared as reported, every request of it went to the first
    (e2e: 12 streams on one worker, 4 of them waiting for a slot, the other idle). Control: without the rows the
    rate was measured at, the busy one wins."""
    one_row = WorkerLoad(num_running=1, num_slots=8, row_tokens_per_s=185.0, rate_rows=1.0)
    idle = WorkerLoad(num_running=0, num_slots=8, row_tokens_per_s=77.0, rate_rows=8.0)
    pool = _pool(one_row, idle)
    picks = []
    for _ in range(12):  # each request still running when the next is picked, as in a burst
        picks.append(picked(pool, "m"))
        pool.endpoints[picks[-1]].outstanding += 1
    assert picks[0] == "w1" and set(picks) == {"w0", "w1"}
    assert abs(picks.count("w0") + 1 - picks.count("w1")) <= 2  # w0 runs one row already
    unknown = WorkerLoad(num_running=0, num_slots=8, row_tokens_per_s=77.0)  # no rate_rows: an older worker
    assert expected_tokens_per_s(one_row, "standard", 0) > expected_tokens_per_s(unknown, "standard", 0)


def test_the_pick_goes_where_the_request_gets_most_and_fails_open_when_a_report_is_stale():
    slow = WorkerLoad(num_running=8, num_waiting=4, num_slots=8, row_tokens_per_s=100.0)
    clock = Clock()
    pool = _pool(slow, FAST, clock=clock)
    assert {picked(pool, "m") for _ in range(20)} == {"w1"}
    clock.now += 6  # both reports are stale now: power of two choices on outstanding requests
    pool.endpoints["w1"].outstanding = 3
    assert {picked(pool, "m") for _ in range(20)} == {"w0"}
    half_known = _pool(FAST, None)  # one never reported: power of two choices, ties either way
    assert {picked(half_known, "m") for _ in range(40)} == {"w0", "w1"}


def test_a_worker_back_at_an_ejected_address_reports_afresh():
    """A worker killed while busy and restarted on its port must not be scored on its predecessor's report (it
    would never be picked while a prefix or a better score holds the other): ejection forgets the report."""
    busy = WorkerLoad(num_running=8, num_waiting=8, num_slots=8, row_tokens_per_s=100.0)
    pool = _pool(busy, FAST)
    assert {picked(pool, "m") for _ in range(20)} == {"w1"}
    pool.eject(pool.endpoints["w0"], "killed")
    pool.endpoints["w0"].healthy = True  # re-admitted by a probe
    assert {picked(pool, "m") for _ in range(40)} == {"w0", "w1"}  # p2c until it reports


def test_a_session_stays_on_its_worker_while_it_is_admitted():
    pool = _pool(FAST, FAST)
    pool.served(pool.endpoints["w0"], "s1", None)
    pool.endpoints["w0"].outstanding = 50  # even busy: its history is there
    assert {picked(pool, "m", session="s1") for _ in range(20)} == {"w0"}
    pool.endpoints["w0"].healthy = False
    assert picked(pool, "m", session="s1") == "w1"
    assert pool.pick("m", exclude={"w1"}, session="s1") is None


def test_a_prompt_prefix_prefers_its_worker_unless_it_scores_far_below_the_best():
    pool = _pool(FAST, FAST)
    key = prefix_key(None, [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}])
    assert key == prefix_key(None, [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "?"}])
    pool.served(pool.endpoints["w1"], None, key)
    assert {picked(pool, "m", prefix=key) for _ in range(10)} == {"w1"}
    pool.observe_load(
        pool.endpoints["w1"], WorkerLoad(num_running=8, num_waiting=16, num_slots=8, row_tokens_per_s=100.0)
    )
    assert picked(pool, "m", prefix=key) == "w0"


def test_the_load_round_trips_through_response_parameters():
    load = WorkerLoad(
        num_running=3,
        num_waiting=1,
        num_slots=8,
        kv_utilization=0.25,
        row_tokens_per_s=42.5,
        acceptance={"interactive": 2.5},
    )
    back = WorkerLoad.from_params(load.to_params())
    assert back == load and WorkerLoad.from_params({}) is None


def test_a_session_header_keeps_every_turn_on_one_worker(tmp_path):
    workers = [Worker(tmp_path, "--stub-step-ms", "1", name=f"w{i}").start() for i in range(2)]
    gw = Gateway(tmp_path, ",".join(w.address for w in workers)).start()
    try:
        for worker in workers:
            worker.wait_ready()
        gw.wait_ready()
        with httpx.Client(timeout=30) as client:
            for turn in range(12):
                for session in ("alpha", "beta", "gamma"):
                    response = client.post(
                        f"{gw.url}/v1/completions",
                        headers={"x-session-id": session},
                        json={"prompt": f"turn {turn}", "max_tokens": 4},
                    )
                    assert response.status_code == 200, response.text
            assert (
                client.post(
                    f"{gw.url}/v1/completions", headers={"x-session-id": "bad\x07"}, json={"prompt": "x"}
                ).status_code
                == 400
            )
        text = httpx.get(f"{gw.url}/metrics").text
        per_worker = [metric_value(text, REQUEST_SUCCESS_TOTAL, worker=w.address) for w in workers]
        assert sum(per_worker) == 36 and all(n % 12 == 0 for n in per_worker)  # whole sessions, never split
    finally:
        gw.terminate()
        for worker in workers:
            worker.terminate()
