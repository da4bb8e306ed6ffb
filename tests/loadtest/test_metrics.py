"""Metric arithmetic on hand-made outputs, so every number is known exactly."""

import math

import pytest

from loadtest.metrics import compute_metrics, meets_slo, parse_slo, percentile, summarize
from loadtest.records import RequestOutput


def ok(ttft, e2e, n, itl=(), prompt=10):
    return RequestOutput(success=True, ttft_s=ttft, e2e_s=e2e, output_tokens=n, itl_s=list(itl), prompt_tokens=prompt)


def failed(kind):
    return RequestOutput(success=False, error_kind=kind)


def test_tpot_is_decode_time_over_tokens_after_the_first():
    # 100 ms to first token, then 9 more tokens in 450 ms -> 50 ms per output token.
    assert ok(0.100, 0.550, 10).tpot_s == pytest.approx(0.050)
    assert ok(0.1, 0.1, 1).tpot_s is None  # one token: no TPOT
    assert failed("timeout").tpot_s is None


def test_summary_keys_and_values_in_ms():
    s = summarize([0.001, 0.002, 0.003, 0.004], "ttft", [50, 99])
    assert s["mean_ttft_ms"] == pytest.approx(2.5)
    assert s["median_ttft_ms"] == pytest.approx(2.5)
    assert s["p50_ttft_ms"] == pytest.approx(2.5)
    assert s["p99_ttft_ms"] == pytest.approx(3.97)  # linear interpolation: 3 + 0.97 * (4 - 3)
    assert summarize([], "itl", [99]) == {
        "mean_itl_ms": 0.0,
        "median_itl_ms": 0.0,
        "std_itl_ms": 0.0,
        "p99_itl_ms": 0.0,
    }


def test_percentile_interpolates_between_ranks_and_is_nan_when_empty():
    assert percentile([4, 1, 3, 2], 50) == pytest.approx(2.5)
    assert percentile([1, 2, 3, 4], 99) == pytest.approx(3.97)
    assert percentile([1, 2, 3, 4], 0) == 1 and percentile([1, 2, 3, 4], 100) == 4
    assert percentile([7.0], 90) == 7.0
    assert math.isnan(percentile([], 50))


def test_bench_and_loadtest_share_one_percentile():
    """bench/ imports the load-test's percentile instead of keeping its own (a second one drifted before)."""
    import bench.loadtest_overhead
    import bench.service_common
    import bench.service_throughput

    assert bench.service_throughput.percentile is percentile and bench.loadtest_overhead.percentile is percentile
    assert not hasattr(bench.service_common, "pct")


def test_throughput_goodput_and_errors():
    outs = [
        ok(0.100, 0.550, 10, itl=[0.05] * 9),  # TTFT 100, TPOT 50, e2e 550: meets all
        ok(0.300, 0.750, 10),  # TTFT 300: misses ttft=200
        ok(0.100, 1.090, 10),  # TPOT 110: misses tpot=100
        ok(0.150, 0.150, 1),  # one token: TPOT not applicable, meets
        failed("http_429"),
        failed("http_429"),
        failed("connect"),
    ]
    m = compute_metrics(outs, duration_s=2.0, slo={"ttft": 200, "tpot": 100}, percentiles=[99])
    assert (m.completed, m.failed) == (4, 3)
    assert m.total_output_tokens == 31 and m.total_input_tokens == 40
    assert m.request_throughput == pytest.approx(2.0)
    assert m.output_throughput == pytest.approx(15.5)
    assert m.total_token_throughput == pytest.approx(35.5)
    assert m.request_goodput == pytest.approx(1.0)  # 2 good requests / 2 s
    assert m.slo_attainment == pytest.approx(2 / 7)  # failures count against attainment
    assert m.errors_by_kind == {"connect": 1, "http_429": 2}
    assert m.latency["mean_ttft_ms"] == pytest.approx((100 + 300 + 100 + 150) / 4)
    assert m.latency["mean_tpot_ms"] == pytest.approx((50 + 50 + 110) / 3)
    assert m.latency["mean_itl_ms"] == pytest.approx(50)
    assert m.latency["median_e2el_ms"] == pytest.approx((550 + 750) / 2)


def test_no_slo_means_no_goodput():
    m = compute_metrics([ok(0.1, 0.2, 2)], 1.0)
    assert m.request_goodput is None and m.slo_attainment is None


def test_e2e_slo_and_boundaries_are_inclusive():
    assert meets_slo(ok(0.2, 1.0, 5), {"ttft": 200, "e2e": 1000})
    assert not meets_slo(ok(0.2, 1.0001, 5), {"e2e": 1000})
    assert not meets_slo(failed("timeout"), {"e2e": 1e9})


def test_parse_slo():
    assert parse_slo("ttft=200, tpot=50,e2e=2000") == {"ttft": 200.0, "tpot": 50.0, "e2e": 2000.0}
    for bad in ["", "ttft", "itl=5", "ttft=abc", "ttft=-1"]:
        with pytest.raises(ValueError):
            parse_slo(bad)
