"""`--compare`: ratios B/A, which side wins, sweeps point by point, and clear errors."""

import json

import pytest

from loadtest.compare import compare_points, compare_reports, load_report

A = {
    "completed": 100,
    "request_throughput": 10.0,
    "mean_ttft_ms": 200.0,
    "median_tpot_ms": 40.0,
    "spec_decode": None,
    "arrival": "closed-loop",
    "request_rate": "inf",
    "max_concurrency": 8,
}
B = dict(
    A,
    request_throughput=25.0,
    mean_ttft_ms=100.0,
    median_tpot_ms=16.0,
    spec_decode={"acceptance_length": 2.5, "acceptance_rate": 0.375},
)


def test_ratios_and_direction():
    rows = {r.label: r for r in compare_points(A, B)}
    assert (
        rows["request throughput (req/s)"].ratio == pytest.approx(2.5) and rows["request throughput (req/s)"].b_better
    )
    assert rows["mean TTFT (ms)"].ratio == pytest.approx(0.5) and rows["mean TTFT (ms)"].b_better
    assert rows["median TPOT (ms)"].ratio == pytest.approx(0.4)
    acc = rows["mean acceptance length (tokens)"]
    assert acc.a is None and acc.b == 2.5 and acc.ratio is None and acc.b_better is None
    assert rows["successful requests"].ratio == 1.0 and rows["successful requests"].b_better is None


def test_sweeps_pair_points_and_must_match():
    tables = compare_reports({"runs": [A, A]}, {"runs": [B, B]})
    assert len(tables) == 2 and "closed-loop" in tables[0][0]
    with pytest.raises(ValueError, match="load points"):
        compare_reports({"runs": [A]}, {"runs": [B, B]})


def test_load_report_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="--result-file"):
        load_report(tmp_path / "nope.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a JSON report"):
        load_report(tmp_path / "x.json")
    (tmp_path / "y.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="not a loadtest report"):
        load_report(tmp_path / "y.json")
