"""Generate the chart's Grafana dashboards (helm/deepspec/dashboards/*.json) from one description.

    python helm/tools/dashboards.py            # rewrite the JSON files
    python helm/tools/dashboards.py --check    # exit 1 when the committed JSON is stale (tests run this)

Two sources, both named in service/metrics.py:
- the gateway's copies (`GW`): per request, labels `model` and `worker`, for every worker runtime. The `worker`
  variable's "All" value is `.+`, so the workers' own unlabelled copies of the same names are never added on top;
- the workers' own series (`WK`): scheduler state, queue time, per-position acceptance and the acceptance-length
  histogram, which only the engine sees. `worker=""` keeps the gateway's copies out; `instance` tells the workers
  apart. A stock Triton worker exports none of these: its own queue and batch gauges (`nv_inference_*`,
  `nv_trt_llm_*`) sit next to ours in the queue and batch panels;
- the cluster's exporters, when present: kube-state-metrics (container restarts) and NVIDIA's DCGM exporter (GPU
  utilisation and memory, per worker pod).
Grafana's `$__rate_interval` keeps rates valid at any scrape interval. Standard library only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling module, whether run or loaded by path
from regenerate import regenerate  # noqa: E402

OUT_DIR = Path(__file__).resolve().parents[1] / "deepspec" / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GW = 'namespace=~"$namespace", model=~"$model", worker=~"$worker"'
WK = 'namespace=~"$namespace", model=~"$model", instance=~"$instance", worker=""'
ROUTING = 'namespace=~"$namespace", worker=~"$worker"'  # the gateway's routing state has no `model`
RATE = "$__rate_interval"
# `status` values that are the server's fault (the chart's errorStatusRegex default); 4xx, aborts and 429 are not.
SERVER_ERRORS = "internal_error|worker_error|worker_failed|no_worker|service_unavailable|timeout"
ERRORS = f'status=~"{SERVER_ERRORS}"'
# What a client sees as "come back later": 429 (every worker saturated) and 503 (no worker, shutting down).
REJECTED = {"429": "server_busy", "503": "no_worker|service_unavailable|worker_failed"}
CONTAINERS = 'namespace=~"$namespace", container=~"gateway|worker|export-engine"'  # kube-state-metrics
GPU_PODS = 'namespace=~"$namespace", pod=~".+-worker-.+"'  # DCGM exporter, with its pod mapping on
QUANTILES = (0.5, 0.9, 0.99)


def rate(metric: str, extra: str = "", sel: str = GW) -> str:
    """`rate(metric{selector}[$__rate_interval])`."""
    selector = sel + (", " + extra if extra else "")
    return f"rate({metric}{{{selector}}}[{RATE}])"


def quantile(q: float, histogram: str, by: str = "", sel: str = GW) -> str:
    """p-quantile of a histogram, optionally kept apart per label."""
    keep = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({keep}) ({rate(histogram + '_bucket', sel=sel)}))"


def target(expr: str, legend: str, ref: str = "A", **extra) -> dict:
    return {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": ref, **extra}


def panel(title: str, targets: list[dict], unit: str, *, kind: str = "timeseries", description: str = "",
          w: int = 12, h: int = 8, stack: bool = False) -> dict:
    for i, t in enumerate(targets):
        t["refId"] = chr(ord("A") + i)
    defaults: dict = {"unit": unit}
    if kind == "timeseries":
        defaults["custom"] = {"fillOpacity": 10, "lineWidth": 1, "showPoints": "never",
                              "stacking": {"mode": "normal" if stack else "none", "group": "A"}}
    return {"type": kind, "title": title, "description": description, "datasource": DATASOURCE,
            "targets": targets, "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "multi", "sort": "desc"}},
            "gridPos": {"w": w, "h": h}}


def latency_panel(title: str, histogram: str, description: str, sel: str = GW) -> dict:
    return panel(title, [target(quantile(q, histogram, sel=sel), f"p{round(q * 100)}") for q in QUANTILES], "s",
                 description=description)


def row(title: str) -> dict:
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "gridPos": {"w": 24, "h": 1}}


def variables() -> list[dict]:
    def query_var(name: str, label: str, query: str, all_value: str) -> dict:
        return {"name": name, "label": label, "type": "query", "datasource": DATASOURCE,
                "query": {"query": query, "refId": name}, "definition": query, "refresh": 2, "sort": 1,
                "multi": True, "includeAll": True, "allValue": all_value,
                "current": {"selected": True, "text": ["All"], "value": ["$__all"]}}

    series = "deepspec:e2e_request_latency_seconds_count"
    return [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0},
        query_var("namespace", "Namespace", f"label_values({series}, namespace)", ".*"),
        query_var("model", "Model", f'label_values({series}{{namespace=~"$namespace"}}, model)', ".*"),
        query_var("worker", "Worker (as the gateway routes)",
                  f'label_values({series}{{namespace=~"$namespace", model=~"$model"}}, worker)', ".+"),
        query_var("instance", "Worker metrics endpoint",
                  'label_values(deepspec:num_requests_running{namespace=~"$namespace", model=~"$model"}, instance)',
                  ".*"),
        {"name": "max_batch_size", "label": "Max batch size (model.maxBatchSize)", "type": "textbox",
         "query": "16", "current": {"text": "16", "value": "16"}, "hide": 0,
         "description": "Batch slots per worker, for the batch utilization panels: the chart's model.maxBatchSize."},
    ]


def layout(panels: list[dict]) -> list[dict]:
    """Flow panels left to right, top to bottom, and number them."""
    x = y = row_h = 0
    for i, p in enumerate(panels, start=1):
        p["id"] = i
        pos = p["gridPos"]
        if x + pos["w"] > 24:
            x, y = 0, y + row_h
            row_h = 0
        pos["x"], pos["y"] = x, y
        x += pos["w"]
        row_h = max(row_h, pos["h"])
    return panels


def dashboard(uid: str, title: str, description: str, panels: list[dict]) -> dict:
    return {
        "uid": uid, "title": title, "description": description, "tags": ["deepspec"],
        "editable": True, "graphTooltip": 1, "schemaVersion": 39, "version": 1, "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"}, "timezone": "browser",
        "templating": {"list": variables()}, "annotations": {"list": []},
        "links": [{"type": "dashboards", "tags": ["deepspec"], "asDropdown": True, "title": "DeepSpec"}],
        "panels": layout(panels),
    }


def overview() -> dict:
    requests = "deepspec:request_success_total"
    return dashboard("deepspec-overview", "DeepSpec / Overview", "Traffic, latency, queueing and tokens.", [
        row("Requests"),
        panel("Request rate by status", [target(f"sum by (status) ({rate(requests)})", "{{status}}")], "reqps",
              description="Finished requests per second by finish reason or error kind.", stack=True),
        panel("Error ratio", [target(f"sum({rate(requests, ERRORS)}) / sum({rate(requests)})", "errors")],
              "percentunit", description="Share of requests that end in a server error (5xx, worker failure); "
                                         "client errors, aborts and 429 are not counted."),
        panel("429 and 503 per second", [
            target(f"sum({rate(requests, f'status=~{chr(34)}{statuses}{chr(34)}')})", code)
            for code, statuses in REJECTED.items()
        ], "reqps", description="Requests turned away: 429 = every worker's queue full (scale the workers); "
                                "503 = no worker ready, or a gateway shutting down."),
        panel("Container restarts", [target(
            f"sum by (pod) (increase(kube_pod_container_status_restarts_total{{{CONTAINERS}}}[1h]))", "{{pod}}")],
              "short", description="Restarts in the last hour per pod (kube-state-metrics): OOM kills, failed "
                                   "liveness probes, crashes."),
        row("Latency"),
        latency_panel("Time to first token", "deepspec:time_to_first_token_seconds",
                      "Request arrival to first streamed token (queueing and prefill)."),
        latency_panel("Inter-token latency", "deepspec:inter_token_latency_seconds",
                      "Time between streamed chunks; a chunk holds every token one verify step accepted."),
        latency_panel("Time per output token", "deepspec:time_per_output_token_seconds",
                      "Per request: (e2e - TTFT) / (output tokens - 1). Speculation lowers it."),
        latency_panel("End-to-end request latency", "deepspec:e2e_request_latency_seconds",
                      "Arrival to last token."),
        row("Queue"),
        latency_panel("Queue time", "deepspec:request_queue_time_seconds",
                      "Time a request waited for a batch slot (workers' own series).", sel=WK),
        panel("Requests running and waiting", [
            target(f"sum(deepspec:num_requests_running{{{WK}}})", "running"),
            target(f"sum(deepspec:num_requests_waiting{{{WK}}})", "waiting"),
            target(f'sum(nv_trt_llm_request_metrics{{namespace=~"$namespace", request_type="active"}})',
                   "running (triton)"),
            target(f'sum(nv_inference_pending_request_count{{namespace=~"$namespace"}})', "waiting (triton)"),
        ], "short", description="Running: in a worker's batch. Waiting: queued for a slot (workers' own series; "
                                "Triton workers' gauges with worker.runtime=triton)."),
        panel("Batch utilization", [
            target(f"sum(deepspec:num_requests_running{{{WK}}}) / (count(deepspec:num_requests_running{{{WK}}})"
                   " * $max_batch_size)", "deepspec"),
        ], "percentunit", description="Busy batch slots: running / (workers x max batch size). Near 1 the queue "
                                      "grows; worker.autoscaling targets it."),
        row("Tokens"),
        panel("Tokens per second", [
            target(f"sum({rate('deepspec:prompt_tokens_total')})", "prompt (in)"),
            target(f"sum({rate('deepspec:generation_tokens_total')})", "generated (out)"),
        ], "short", description="Prompt tokens read and tokens generated per second.", w=24),
        row("Routing"),
        panel("Healthy workers", [target(
            f"count(max by (worker) (deepspec:gateway_worker_healthy{{{ROUTING}}}) == 1)", "admitted")], "short",
              kind="stat", w=6, description="Workers the gateway routes to (ejected ones are excluded)."),
        panel("Outstanding requests", [target(
            f"sum(deepspec:gateway_num_requests_outstanding{{{ROUTING}}})", "outstanding")], "short", w=9,
              description="Requests sent to a worker and not finished."),
        panel("Retries", [target(f"sum({rate('deepspec:gateway_retries_total', sel=ROUTING)})", "retries/s")],
              "reqps", w=9, description="Requests moved to another worker before their first token."),
    ])


def spec_decode() -> dict:
    accepted = rate("deepspec:spec_decode_num_accepted_tokens_total")
    drafts = rate("deepspec:spec_decode_num_drafts_total")
    draft_tokens = rate("deepspec:spec_decode_num_draft_tokens_total")
    per_pos = rate("deepspec:spec_decode_num_accepted_tokens_per_pos_total", sel=WK)
    worker_drafts = rate("deepspec:spec_decode_num_drafts_total", sel=WK)
    return dashboard("deepspec-spec-decode", "DeepSpec / Speculative decoding",
                     "How much of each draft the target accepts, and what that buys.", [
        panel("Acceptance rate", [target(f"sum by (model) ({accepted}) / sum by (model) ({draft_tokens})",
                                         "{{model}}")], "percentunit",
              description="Accepted draft tokens / proposed draft tokens."),
        panel("Mean acceptance length", [target(f"1 + sum by (model) ({accepted}) / sum by (model) ({drafts})",
                                                "{{model}}")], "short",
              description="Tokens per verify step, bonus token included: 1 + accepted / drafts. "
                          "1.0 means the draft never helps."),
        panel("Acceptance by draft position", [
            target(f"sum by (position) ({per_pos}) / ignoring(position) group_left() sum({worker_drafts})",
                   "position {{position}}"),
        ], "percentunit", kind="bargauge",
              description="Share of drafts whose token at each position was accepted; it can only fall "
                          "with position."),
        panel("Draft tokens per second", [
            target(f"sum({draft_tokens})", "proposed"),
            target(f"sum({accepted})", "accepted"),
            target(f"sum({drafts})", "drafts (verify steps)"),
        ], "short", description="Draft tokens the drafter proposed and the target accepted, per second."),
        panel("Acceptance length percentiles", [
            target(quantile(q, "deepspec:spec_decode_acceptance_length", sel=WK), f"p{round(q * 100)}")
            for q in QUANTILES
        ], "short", description="Tokens emitted per verify step, bonus token included."),
        panel("Acceptance length distribution", [
            target(f"sum by (le) ({rate('deepspec:spec_decode_acceptance_length_bucket', sel=WK)})", "{{le}}",
                   format="heatmap"),
        ], "short", kind="heatmap", description="Histogram of tokens emitted per verify step."),
    ])


def workers() -> dict:
    def per_worker(title: str, expr: str, unit: str, description: str = "") -> dict:
        return panel(title, [target(expr, "{{worker}}")], unit, description=description)

    def per_instance(title: str, expr: str, unit: str, description: str = "") -> dict:
        return panel(title, [target(expr, "{{instance}}")], unit, description=description)

    requests = "deepspec:request_success_total"
    return dashboard("deepspec-workers", "DeepSpec / Workers",
                     "Per worker: as the gateway routes to it (`worker`) and from its own metrics (`instance`).", [
        row("As the gateway sees each worker"),
        per_worker("Request rate per worker", f"sum by (worker) ({rate(requests)})", "reqps"),
        per_worker("Error ratio per worker",
                   f"sum by (worker) ({rate(requests, ERRORS)}) / sum by (worker) ({rate(requests)})", "percentunit"),
        per_worker("p99 time to first token per worker",
                   quantile(0.99, "deepspec:time_to_first_token_seconds", "worker"), "s"),
        per_worker("p99 time per output token per worker",
                   quantile(0.99, "deepspec:time_per_output_token_seconds", "worker"), "s"),
        per_worker("Generated tokens per second per worker",
                   f"sum by (worker) ({rate('deepspec:generation_tokens_total')})", "short"),
        per_worker("Acceptance rate per worker",
                   f"sum by (worker) ({rate('deepspec:spec_decode_num_accepted_tokens_total')})"
                   f" / sum by (worker) ({rate('deepspec:spec_decode_num_draft_tokens_total')})", "percentunit"),
        per_worker("Outstanding requests per worker",
                   f"sum by (worker) (deepspec:gateway_num_requests_outstanding{{{ROUTING}}})", "short"),
        per_worker("Admitted to routing", f"min by (worker) (deepspec:gateway_worker_healthy{{{ROUTING}}})", "bool",
                   "1 while the gateway routes to the worker, 0 while its health checks eject it."),
        per_worker("Retries away from each worker",
                   f"sum by (worker) ({rate('deepspec:gateway_retries_total', sel=ROUTING)})", "reqps"),
        row("From each worker's own metrics"),
        per_instance("Running per worker", f"sum by (instance) (deepspec:num_requests_running{{{WK}}})", "short"),
        per_instance("Waiting per worker", f"sum by (instance) (deepspec:num_requests_waiting{{{WK}}})", "short"),
        per_instance("p99 queue time per worker",
                     quantile(0.99, "deepspec:request_queue_time_seconds", "instance", sel=WK), "s"),
        per_instance("Batch utilization per worker",
                     f"sum by (instance) (deepspec:num_requests_running{{{WK}}}) / $max_batch_size", "percentunit"),
        row("GPUs (NVIDIA DCGM exporter, when installed)"),
        panel("GPU utilization", [target(f"avg by (pod, gpu) (DCGM_FI_DEV_GPU_UTIL{{{GPU_PODS}}}) / 100",
                                         "{{pod}} gpu {{gpu}}")], "percentunit",
              description="Share of time a kernel ran, per GPU of each worker pod."),
        panel("GPU memory used", [target(f"avg by (pod, gpu) (DCGM_FI_DEV_FB_USED{{{GPU_PODS}}}) * 1048576",
                                         "{{pod}} gpu {{gpu}}")], "bytes",
              description="Frame-buffer memory in use per GPU (weights, KV cache, activations)."),
    ])


DASHBOARDS = {"deepspec-overview": overview, "deepspec-spec-decode": spec_decode, "deepspec-workers": workers}


def render() -> dict[Path, str]:
    """Path -> JSON text of every dashboard."""
    return {OUT_DIR / f"{name}.json": json.dumps(build(), indent=2) + "\n" for name, build in DASHBOARDS.items()}


def main(argv: list[str] | None = None) -> int:
    return regenerate(render, argv, __doc__.splitlines()[0], "helm/tools/dashboards.py")


if __name__ == "__main__":
    raise SystemExit(main())
