"""The JSON report and the text summary of a run.

Field names are `vllm bench serve`'s where the two overlap (`completed`, `request_throughput`, `output_throughput`,
`request_goodput`, `mean_ttft_ms`, `p99_itl_ms`, `median_e2el_ms`, ...; `request_rate` is the string "inf" for an
unbounded rate; `ttfts`/`itls` in seconds), so dashboards and scripts written for vLLM results read ours. DeepSpec
adds `failed` details (`errors_by_kind`), `slo`, `slo_attainment`, `spec_decode`, `arrival` and
`metric_definitions`. A sweep writes `{"sweep_over": ..., "runs": [<one report per point>]}`.

Per-request arrays (`input_lens`, `output_lens`, `ttfts`, `itls`, `generated_texts`, `errors`) are included only
when asked (`--save-detailed`), as in vLLM: they grow with the run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime

from loadtest.metrics import RunMetrics, compute_metrics
from loadtest.runner import PointResult

SCHEMA_VERSION = 1

METRIC_DEFINITIONS = {
    "ttft": "time to first token: request sent -> first response chunk carrying output text (ms)",
    "itl": "inter-token latency: gap between successive output-carrying chunks; a chunk may hold several tokens "
    "under speculative decoding (ms)",
    "tpot": "time per output token after the first: (e2e - ttft) / (output tokens - 1); requests with < 2 output "
    "tokens are left out (ms)",
    "e2el": "end-to-end latency: request sent -> last byte of the response (ms)",
    "request_throughput": "successful requests / duration (req/s); duration = first send -> last response",
    "output_throughput": "output tokens of successful requests / duration (tok/s)",
    "request_goodput": "successful requests meeting every SLO / duration (req/s)",
    "spec_decode.acceptance_length": "1 + accepted / drafts, from the server's deepspec:spec_decode_* counters",
    "spec_decode.acceptance_rate": "accepted / draft tokens, from the same counters",
}

DETAILED_FIELDS = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors")


def point_report(
    result: PointResult,
    *,
    meta: dict,
    slo: dict[str, float] | None = None,
    percentiles: Sequence[float] = (90, 99),
    detailed: bool = False,
) -> dict:
    """One load point as a flat JSON-able dict. `meta` carries the run's identity (backend, model_id, ...)."""
    run, point = result.run, result.point
    m: RunMetrics = compute_metrics(run.outputs, run.duration_s, slo=slo, percentiles=percentiles)
    rep: dict = {
        "schema_version": SCHEMA_VERSION,
        "date": datetime.now(UTC).strftime("%Y%m%d-%H%M%S"),
        **meta,
        "arrival": point.kind.value,
        "request_rate": "inf" if math.isinf(point.request_rate) else point.request_rate,
        "burstiness": point.burstiness,
        "max_concurrency": point.max_concurrency,
        "num_warmups": result.num_warmups,
        "duration": m.duration,
        "completed": m.completed,
        "failed": m.failed,
        "num_cancelled": run.num_cancelled,
        "interrupted": run.interrupted,
        "total_input_tokens": m.total_input_tokens,
        "total_output_tokens": m.total_output_tokens,
        "request_throughput": m.request_throughput,
        "request_goodput": m.request_goodput,
        "output_throughput": m.output_throughput,
        "total_token_throughput": m.total_token_throughput,
        "max_concurrent_requests": run.max_concurrent_requests,
        "slo": slo,
        "slo_attainment": m.slo_attainment,
        "errors_by_kind": m.errors_by_kind,
        **m.latency,
        "spec_decode": result.spec_decode.to_json() if result.spec_decode else None,
        "spec_decode_note": result.spec_decode_note,
        "metric_definitions": METRIC_DEFINITIONS,
    }
    if detailed:
        outs = run.outputs
        rep.update(
            input_lens=[o.prompt_tokens for o in outs],
            output_lens=[o.output_tokens for o in outs],
            ttfts=[o.ttft_s for o in outs],
            itls=[o.itl_s for o in outs],
            generated_texts=[o.generated_text for o in outs],
            errors=[o.error if not o.success else "" for o in outs],
        )
    return rep


def sweep_report(reports: list[dict], sweep_over: str) -> dict:
    return {"schema_version": SCHEMA_VERSION, "sweep_over": sweep_over, "runs": reports}


def format_summary(rep: dict, percentiles: Sequence[float] = (90, 99)) -> str:
    """The text block printed after each point, laid out like `vllm bench serve`'s."""
    w = 50

    def line(label: str, value: object) -> str:
        if isinstance(value, float):
            value = f"{value:.2f}"
        return f"{label:<40}{value!s:>10}"

    rows = [" Serving Benchmark Result ".center(w, "=")]
    rows.append(line("Load:", rep["arrival"]))
    rows.append(line("Traffic request rate (req/s):", rep["request_rate"]))
    if rep["arrival"] == "gamma":
        rows.append(line("Burstiness factor:", rep["burstiness"]))
    rows.append(line("Max request concurrency:", rep["max_concurrency"] or "none"))
    rows.append(line("Successful requests:", rep["completed"]))
    rows.append(line("Failed requests:", rep["failed"]))
    for kind, n in rep["errors_by_kind"].items():
        rows.append(line(f"  {kind}:", n))
    if rep["interrupted"]:
        rows.append(line("Interrupted (partial); cancelled:", rep["num_cancelled"]))
    rows.append(line("Benchmark duration (s):", rep["duration"]))
    rows.append(line("Total input tokens:", rep["total_input_tokens"]))
    rows.append(line("Total generated tokens:", rep["total_output_tokens"]))
    rows.append(line("Request throughput (req/s):", rep["request_throughput"]))
    if rep["request_goodput"] is not None:
        rows.append(line("SLO (ms):", ",".join(f"{k}={v:g}" for k, v in rep["slo"].items())))
        rows.append(line("Request goodput (req/s):", rep["request_goodput"]))
        rows.append(line("SLO attainment (%):", 100 * rep["slo_attainment"]))
    rows.append(line("Output token throughput (tok/s):", rep["output_throughput"]))
    rows.append(line("Total token throughput (tok/s):", rep["total_token_throughput"]))
    rows.append(line("Max concurrent requests:", rep["max_concurrent_requests"]))
    titles = {
        "ttft": ("Time to First Token", "TTFT"),
        "tpot": ("Time per Output Token (excl. 1st token)", "TPOT"),
        "itl": ("Inter-token Latency (per chunk)", "ITL"),
        "e2el": ("End-to-end Latency", "E2EL"),
    }
    for key, (title, short) in titles.items():
        rows.append(title.center(w, "-"))
        rows.append(line(f"Mean {short} (ms):", rep[f"mean_{key}_ms"]))
        rows.append(line(f"Median {short} (ms):", rep[f"median_{key}_ms"]))
        for p in percentiles:
            rows.append(line(f"P{p:g} {short} (ms):", rep[f"p{p:g}_{key}_ms"]))
    sd = rep.get("spec_decode")
    rows.append("Speculative Decoding".center(w, "-"))
    if sd:
        rows.append(line("Drafts:", sd["num_drafts"]))
        rows.append(line("Draft tokens:", sd["num_draft_tokens"]))
        rows.append(line("Accepted tokens:", sd["num_accepted_tokens"]))
        if sd["acceptance_rate"] is not None:
            rows.append(line("Acceptance rate (%):", 100 * sd["acceptance_rate"]))
            rows.append(line("Mean acceptance length (tokens):", sd["acceptance_length"]))
        rates = ", ".join(f"{r:.2f}" for r in sd["per_position_acceptance_rate"])
        if rates:
            rows.append(f"Per-position acceptance: {rates}")
    else:
        rows.append(f"not available ({rep.get('spec_decode_note') or 'no counters'})")
    rows.append("=" * w)
    return "\n".join(rows)


def format_sweep_table(reports: Sequence[dict], sweep_over: str) -> str:
    """One line per load point, for reading a sweep at a glance (throughput and the latencies that saturate)."""
    cols = [
        (sweep_over, sweep_over.replace("_", " "), "{}"),
        ("completed", "ok", "{}"),
        ("failed", "failed", "{}"),
        ("request_throughput", "req/s", "{:.2f}"),
        ("request_goodput", "goodput", "{:.2f}"),
        ("output_throughput", "tok/s", "{:.1f}"),
        ("median_ttft_ms", "TTFT p50 ms", "{:.1f}"),
        ("p99_ttft_ms", "TTFT p99 ms", "{:.1f}"),
        ("median_tpot_ms", "TPOT p50 ms", "{:.2f}"),
        ("p99_tpot_ms", "TPOT p99 ms", "{:.2f}"),
    ]
    cols = [c for c in cols if all(c[0] in r for r in reports)]

    def cell(r: dict, key: str, fmt: str) -> str:
        return "-" if r[key] is None else fmt.format(r[key])

    table = [[h for _, h, _ in cols]] + [[cell(r, k, f) for k, _, f in cols] for r in reports]
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    return "\n".join("  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in table)
