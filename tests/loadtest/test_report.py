"""The JSON report: vLLM's field names and types where they overlap, our additions, detailed arrays, summary."""

import json
import math

from loadtest.arrivals import LoadPoint
from loadtest.records import RequestOutput
from loadtest.report import DETAILED_FIELDS, format_summary, format_sweep_table, point_report, sweep_report
from loadtest.runner import PointResult, RunResult
from loadtest.spec_stats import SpecDecodeStats

#: keys `vllm bench serve --save-result` writes that we write too, with their types.
VLLM_FIELDS = {
    "date": str,
    "backend": str,
    "model_id": (str, type(None)),
    "tokenizer_id": (str, type(None)),
    "num_prompts": int,
    "request_rate": (float, str),
    "burstiness": float,
    "max_concurrency": (int, type(None)),
    "duration": float,
    "completed": int,
    "failed": int,
    "total_input_tokens": int,
    "total_output_tokens": int,
    "request_throughput": float,
    "request_goodput": (float, type(None)),
    "output_throughput": float,
    "total_token_throughput": float,
    "max_concurrent_requests": int,
}
LATENCY_KEYS = [f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "std", "p99")]
META = {"backend": "openai", "model_id": "m", "tokenizer_id": None, "num_prompts": 3, "label": "draft"}


def result(interrupted=False):
    outs = [
        RequestOutput(
            success=True, ttft_s=0.1, e2e_s=0.5, itl_s=[0.1] * 4, output_tokens=5, prompt_tokens=7, generated_text="x"
        ),
        RequestOutput(success=True, ttft_s=0.2, e2e_s=0.6, itl_s=[0.2] * 2, output_tokens=3, prompt_tokens=7),
        RequestOutput(success=False, error_kind="http_429", error="too many"),
    ]
    sd = SpecDecodeStats(10, 40, 20, 0.5, 3.0, [1.0, 1.0, 0.0, 0.0])
    return PointResult(LoadPoint(4.0), RunResult(outs, 2.0, interrupted, 1 if interrupted else 0, 2), sd, None, 1)


def test_vllm_fields_and_types():
    rep = point_report(result(), meta=META, slo={"ttft": 150}, percentiles=[99])
    for key, typ in VLLM_FIELDS.items():
        assert isinstance(rep[key], typ), (key, rep[key])
    for key in LATENCY_KEYS:
        assert isinstance(rep[key], float) and math.isfinite(rep[key]), key
    assert rep["completed"] == 2 and rep["failed"] == 1 and rep["request_throughput"] == 1.0
    assert rep["request_goodput"] == 0.5 and rep["slo_attainment"] == 1 / 3
    assert rep["errors_by_kind"] == {"http_429": 1}
    assert rep["spec_decode"]["acceptance_length"] == 3.0 and rep["arrival"] == "poisson"
    assert "tpot" in rep["metric_definitions"]
    assert not any(k in rep for k in DETAILED_FIELDS)
    assert json.loads(json.dumps(rep)) == rep  # plain JSON: no NaN, no objects


def test_inf_rate_is_the_string_inf_and_detailed_arrays():
    res = result()
    res.point = LoadPoint(max_concurrency=2)
    rep = point_report(res, meta=META, detailed=True)
    assert rep["request_rate"] == "inf" and rep["max_concurrency"] == 2 and rep["request_goodput"] is None
    assert rep["ttfts"] == [0.1, 0.2, 0.0] and rep["output_lens"] == [5, 3, 0] and rep["errors"] == ["", "", "too many"]
    assert rep["itls"][0] == [0.1] * 4 and len(rep["generated_texts"]) == 3


def test_summary_text_and_sweep():
    rep = point_report(result(interrupted=True), meta=META, slo={"ttft": 150, "e2e": 1000})
    text = format_summary(rep)
    for needle in (
        "Successful requests:",
        "http_429",
        "Request goodput",
        "P99 TPOT (ms):",
        "Mean acceptance length",
        "Interrupted",
    ):
        assert needle in text
    doc = sweep_report([rep, rep], "request_rate")
    assert doc["sweep_over"] == "request_rate" and len(doc["runs"]) == 2


def test_sweep_table_has_a_line_per_point():
    reps = [point_report(result(), meta=META, slo={"ttft": 150}), point_report(result(), meta=META)]
    lines = format_sweep_table(reps, "request_rate").splitlines()
    assert len(lines) == 3 and "req/s" in lines[0] and "TTFT p99 ms" in lines[0]
    assert lines[2].split()[4] == "-"  # no SLO on the second point: no goodput
