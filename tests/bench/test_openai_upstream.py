"""bench.openai_upstream: the summary's verdicts follow the targets (added p50 <= 1 ms, p99 <= 5 ms, streaming >= 0.97x
direct) and the per-request CPU column counts the server process's own time."""

from __future__ import annotations

import sys

import bench.service_common
from bench.openai_upstream import cpu_seconds, summary
from bench.service_common import Proc


def _latency(added_p50: float, gateway_cpu: float) -> dict:
    return {
        "direct": {"p50_ms": 4.0, "p99_ms": 6.0},
        "gateway": {
            "p50_ms": 4.0 + added_p50,
            "p99_ms": 7.0,
            "added_p50_ms": added_p50,
            "added_p99_ms": 1.0,
            "cpu_ms_per_request": gateway_cpu,
        },
        "relay": {"p50_ms": 4.1, "p99_ms": 6.1, "added_p50_ms": 0.1, "added_p99_ms": 0.1, "cpu_ms_per_request": 0.1},
    }


def _throughput(ratio: float) -> dict:
    return {
        "direct": {"tokens_per_s": 1000.0},
        "gateway": {"tokens_per_s": 1000.0 * ratio, "ratio": ratio},
        "relay": {"tokens_per_s": 990.0, "ratio": 0.99},
    }


def _report(added_p50: float, ratio: float, ratio_apart: float) -> dict:
    return {
        "load_average_1m": 0.5,
        "cpus": 2,
        "placement": {"upstream": [0], "front": [1]},
        "upstreams": {
            "stub": {
                "latency": _latency(added_p50, 0.96),
                "throughput": _throughput(ratio),
                "throughput_gateway_apart": _throughput(ratio_apart),
            },
            "canned": {"latency": _latency(0.37, 0.38)},
            "canned, idle": {"latency": _latency(1.39, 1.29)},
        },
    }


def test_the_verdicts_follow_the_targets():
    met = _report(added_p50=0.9, ratio=0.98, ratio_apart=0.96)
    text = summary(met, 32)
    assert met["targets_met"] == {"latency": True, "throughput": True, "throughput_gateway_apart": False}
    assert "added p50 <= 1 ms and p99 <= 5 ms: met" in text and "NOT met with the gateway apart" in text
    missed = _report(added_p50=1.1, ratio=0.96, ratio_apart=0.97)
    summary(missed, 32)
    assert missed["targets_met"] == {"latency": False, "throughput": False, "throughput_gateway_apart": True}


def test_every_latency_row_shows_the_gateways_and_the_relays_cpu_per_request():
    text = summary(_report(0.9, 0.98, 0.98), 32)
    header = next(line for line in text.splitlines() if line.startswith("| upstream"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| ") and not line.startswith("| upstream")
    }
    gateway_cpu, relay_cpu = columns.index("gateway CPU ms/request"), columns.index("relay CPU ms/request")
    assert [rows[name][gateway_cpu] for name in ("stub", "canned", "canned, idle")] == ["0.96", "0.38", "1.29"]
    assert rows["canned, idle"][relay_cpu] == "0.10"


def test_cpu_seconds_counts_the_process_own_time(tmp_path, monkeypatch):
    monkeypatch.setattr(bench.service_common, "RESULTS", tmp_path)  # the process's log goes here
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ntime.sleep(60)"
    proc = Proc([sys.executable, "-c", spin], "spinner")
    try:
        proc.wait_until(lambda: cpu_seconds(proc) >= 0.3, timeout_s=60)
        spent = cpu_seconds(proc)
        assert 0.3 <= spent < 5  # its spin (and start-up), not this process's time
    finally:
        proc.stop()
