"""Generate the chart's Grafana dashboards (helm/deepspec/dashboards/*.json) from one description, with Grafana's
own typed SDK (`grafana-foundation-sdk`): every panel, query and variable is built by its builder, so a field the
dashboard model does not have is an error here rather than a panel Grafana silently drops.

    python helm/tools/dashboards.py            # rewrite the JSON files
    python helm/tools/dashboards.py --check    # exit 1 when the committed JSON is stale (tests run this)

Sources, all named in service/metrics.py or helm/tools/engine_metrics.py:
- the gateway's copies (`GW`): per request, labels `model` and `worker`, for every worker runtime. The `worker`
  variable's "All" value is `.+`, so the workers' own unlabelled copies of the same names are never added on top;
- the workers' own series (`WK`): scheduler state, queue time, per-position acceptance and the acceptance-length
  histogram, which only the engine sees. `worker=""` keeps the gateway's copies out; `instance` tells the workers
  apart. A Triton worker exports none of these: the exported LLM-API model's queue gauges
  (`deepspec_llmapi_num_requests_*`, export/triton/llmapi_model.py) sit next to ours in the queue panel;
- the engine's own metrics under shared names (`deepspec_engine:*`, recorded by the chart's PrometheusRule from
  whatever `worker.runtime` exports): the Engine dashboard, the same panels for every runtime;
- the cluster's exporters, when present: kube-state-metrics (container restarts) and NVIDIA's DCGM exporter (GPU
  utilisation and memory, per worker pod).
Grafana's `$__rate_interval` keeps rates valid at any scrape interval.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import bargauge, heatmap, prometheus, stat, timeseries
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as models
from grafana_foundation_sdk.models import prometheus as prometheus_models

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling modules, whether run or loaded by path
from engine_metrics import PREFIX as ENGINE
from engine_metrics import WINDOW
from regenerate import regenerate

OUT_DIR = Path(__file__).resolve().parents[1] / "deepspec" / "dashboards"
DATASOURCE = models.DataSourceRef(type_val="prometheus", uid="${datasource}")
GW = 'namespace=~"$namespace", model=~"$model", worker=~"$worker"'
WK = 'namespace=~"$namespace", model=~"$model", instance=~"$instance", worker=""'
ROUTING = 'namespace=~"$namespace", worker=~"$worker"'  # the gateway's routing state has no `model`
RATE = "$__rate_interval"
# `status` values that are the server's fault (the chart's errorStatusRegex default); 4xx, aborts and 429 are not.
SERVER_ERRORS = "internal_error|worker_error|worker_failed|no_worker|service_unavailable|timeout"
ERRORS = f'status=~"{SERVER_ERRORS}"'
# What a client sees as "come back later": 429 (every worker saturated) and 503 (no worker, shutting down).
REJECTED = {"429": "server_busy", "503": "no_worker|service_unavailable|worker_failed"}
CONTAINERS = 'namespace=~"$namespace", container=~"gateway|worker|export-bundle"'  # kube-state-metrics
GPU_PODS = 'namespace=~"$namespace", pod=~".+-worker-.+"'  # DCGM exporter, with its pod mapping on
QUANTILES = (0.5, 0.9, 0.99)
EN = 'namespace=~"$namespace", model=~"$model"'  # the engine's recorded copies
PANELS = {"timeseries": timeseries.Panel, "stat": stat.Panel, "bargauge": bargauge.Panel, "heatmap": heatmap.Panel}


def rate(metric: str, extra: str = "", sel: str = GW) -> str:
    """`rate(metric{selector}[$__rate_interval])`."""
    selector = sel + (", " + extra if extra else "")
    return f"rate({metric}{{{selector}}}[{RATE}])"


def quantile(q: float, histogram: str, by: str = "", sel: str = GW) -> str:
    """p-quantile of a histogram, optionally kept apart per label."""
    keep = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({keep}) ({rate(histogram + '_bucket', sel=sel)}))"


def target(expr: str, legend: str, *, heatmap_format: bool = False) -> prometheus.Dataquery:
    query = prometheus.Dataquery().expr(expr).legend_format(legend).datasource(DATASOURCE)
    return query.format(prometheus_models.PromQueryFormat.HEATMAP) if heatmap_format else query


def panel(
    title: str,
    targets: list[prometheus.Dataquery],
    unit: str,
    *,
    kind: str = "timeseries",
    description: str = "",
    w: int = 12,
    h: int = 8,
    stack: bool = False,
):
    """A panel of `kind` with its queries lettered A, B, ... and the chart's legend and tooltip conventions."""
    built = PANELS[kind]().title(title).description(description).datasource(DATASOURCE).unit(unit).span(w).height(h)
    for i, t in enumerate(targets):
        built.with_target(t.ref_id(chr(ord("A") + i)))
    if kind == "bargauge":
        built.display_mode(common.BarGaugeDisplayMode.GRADIENT).orientation(common.VizOrientation.HORIZONTAL)
    elif kind == "stat":
        built.color_mode(common.BigValueColorMode.VALUE).orientation(common.VizOrientation.AUTO)
    elif kind == "heatmap":
        built.calculate(False)
    elif kind == "timeseries":
        stacking = (
            common_builders.StackingConfig()
            .mode(common.StackingMode.NORMAL if stack else common.StackingMode.NONE)
            .group("A")
        )
        built.fill_opacity(10).line_width(1).show_points(common.VisibilityMode.NEVER).stacking(stacking)
        built.legend(
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        built.tooltip(
            common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI).sort(common.SortOrder.DESCENDING)
        )
    return built


def latency_panel(title: str, histogram: str, description: str, sel: str = GW) -> dict:
    return panel(
        title,
        [target(quantile(q, histogram, sel=sel), f"p{round(q * 100)}") for q in QUANTILES],
        "s",
        description=description,
    )


def row(title: str) -> dashboard_builders.Row:
    return dashboard_builders.Row(title)


def variables(
    series: str = "deepspec:e2e_request_latency_seconds_count", running: str = "deepspec:num_requests_running"
) -> list:
    """Data source, namespace, model, worker, instance and batch size; `series` and `running` are the series the
    namespace/model and instance choices are read from."""

    def query_var(name: str, label: str, query: str, all_value: str) -> dashboard_builders.QueryVariable:
        return (
            dashboard_builders.QueryVariable(name)
            .label(label)
            .datasource(DATASOURCE)
            .query({"query": query, "refId": name})
            .refresh(models.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(models.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(all_value)
            .current(models.VariableOption(selected=True, text=["All"], value=["$__all"]))
        )

    return [
        dashboard_builders.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        query_var("namespace", "Namespace", f"label_values({series}, namespace)", ".*"),
        query_var("model", "Model", f'label_values({series}{{namespace=~"$namespace"}}, model)', ".*"),
        query_var(
            "worker",
            "Worker (as the gateway routes)",
            f'label_values({series}{{namespace=~"$namespace", model=~"$model"}}, worker)',
            ".+",
        ),
        query_var(
            "instance",
            "Worker metrics endpoint",
            f'label_values({running}{{namespace=~"$namespace", model=~"$model"}}, instance)',
            ".*",
        ),
        dashboard_builders.TextBoxVariable("max_batch_size")
        .label("Max batch size (model.maxBatchSize)")
        .default_value("16")
        .current(models.VariableOption(text="16", value="16"))
        .description("Batch slots per worker, for the batch utilization panels: the chart's model.maxBatchSize."),
    ]


def dashboard(uid: str, title: str, description: str, panels: list, variable_list: list | None = None) -> dict:
    """The dashboard as Grafana's JSON model; panels are numbered in order and flow left to right, top to bottom
    (the SDK's own layout)."""
    board = (
        dashboard_builders.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["deepspec"])
        .editable()
        .tooltip(models.DashboardCursorSync.CROSSHAIR)
        .version(1)
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .variables(variable_list or variables())
        .link(
            dashboard_builders.DashboardLink("DeepSpec")
            .type(models.DashboardLinkType.DASHBOARDS)
            .tags(["deepspec"])
            .as_dropdown(True)
        )
    )
    for i, p in enumerate(panels, start=1):
        p.id(i)
        if isinstance(p, dashboard_builders.Row):
            board.with_row(p)
        else:
            board.with_panel(p)
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))


def overview() -> dict:
    requests = "deepspec:request_success_total"
    return dashboard(
        "deepspec-overview",
        "DeepSpec / Overview",
        "Traffic, latency, queueing and tokens.",
        [
            row("Requests"),
            panel(
                "Request rate by status",
                [target(f"sum by (status) ({rate(requests)})", "{{status}}")],
                "reqps",
                description="Finished requests per second by finish reason or error kind.",
                stack=True,
            ),
            panel(
                "Error ratio",
                [target(f"sum({rate(requests, ERRORS)}) / sum({rate(requests)})", "errors")],
                "percentunit",
                description="Share of requests that end in a server error (5xx, worker failure); "
                "client errors, aborts and 429 are not counted.",
            ),
            panel(
                "429 and 503 per second",
                [
                    target(f"sum({rate(requests, f'status=~{chr(34)}{statuses}{chr(34)}')})", code)
                    for code, statuses in REJECTED.items()
                ],
                "reqps",
                description="Requests turned away: 429 = every worker's queue full (scale the workers); "
                "503 = no worker ready, or a gateway shutting down.",
            ),
            panel(
                "Container restarts",
                [
                    target(
                        f"sum by (pod) (increase(kube_pod_container_status_restarts_total{{{CONTAINERS}}}[1h]))",
                        "{{pod}}",
                    )
                ],
                "short",
                description="Restarts in the last hour per pod (kube-state-metrics): OOM kills, failed "
                "liveness probes, crashes.",
            ),
            row("Latency"),
            latency_panel(
                "Time to first token",
                "deepspec:time_to_first_token_seconds",
                "Request arrival to first streamed token (queueing and prefill).",
            ),
            latency_panel(
                "Inter-token latency",
                "deepspec:inter_token_latency_seconds",
                "Time between streamed chunks; a chunk holds every token one verify step accepted.",
            ),
            latency_panel(
                "Time per output token",
                "deepspec:time_per_output_token_seconds",
                "Per request: (e2e - TTFT) / (output tokens - 1). Speculation lowers it.",
            ),
            latency_panel(
                "End-to-end request latency", "deepspec:e2e_request_latency_seconds", "Arrival to last token."
            ),
            row("Queue"),
            latency_panel(
                "Queue time",
                "deepspec:request_queue_time_seconds",
                "Time a request waited for a batch slot (workers' own series).",
                sel=WK,
            ),
            panel(
                "Requests running and waiting",
                [
                    target(f"sum(deepspec:num_requests_running{{{WK}}})", "running"),
                    target(f"sum(deepspec:num_requests_waiting{{{WK}}})", "waiting"),
                    target('sum(deepspec_llmapi_num_requests_running{namespace=~"$namespace"})', "running (triton)"),
                    target('sum(deepspec_llmapi_num_requests_waiting{namespace=~"$namespace"})', "waiting (triton)"),
                ],
                "short",
                description="Running: in a worker's batch. Waiting: queued for a slot (workers' own series; "
                "the exported Triton model's gauges with worker.runtime=triton).",
            ),
            panel(
                "Batch utilization",
                [
                    target(
                        f"sum(deepspec:num_requests_running{{{WK}}}) / (count(deepspec:num_requests_running{{{WK}}})"
                        " * $max_batch_size)",
                        "deepspec",
                    ),
                ],
                "percentunit",
                description="Busy batch slots: running / (workers x max batch size). Near 1 the queue "
                "grows; worker.autoscaling targets it.",
            ),
            row("Tokens"),
            panel(
                "Tokens per second",
                [
                    target(f"sum({rate('deepspec:prompt_tokens_total')})", "prompt (in)"),
                    target(f"sum({rate('deepspec:generation_tokens_total')})", "generated (out)"),
                ],
                "short",
                description="Prompt tokens read and tokens generated per second.",
                w=24,
            ),
            row("Routing"),
            panel(
                "Healthy workers",
                [target(f"count(max by (worker) (deepspec:gateway_worker_healthy{{{ROUTING}}}) == 1)", "admitted")],
                "short",
                kind="stat",
                w=6,
                description="Workers the gateway routes to (ejected ones are excluded).",
            ),
            panel(
                "Outstanding requests",
                [target(f"sum(deepspec:gateway_num_requests_outstanding{{{ROUTING}}})", "outstanding")],
                "short",
                w=9,
                description="Requests sent to a worker and not finished.",
            ),
            panel(
                "Retries",
                [target(f"sum({rate('deepspec:gateway_retries_total', sel=ROUTING)})", "retries/s")],
                "reqps",
                w=9,
                description="Requests moved to another worker before their first token.",
            ),
        ],
    )


def spec_decode() -> dict:
    accepted = rate("deepspec:spec_decode_num_accepted_tokens_total")
    drafts = rate("deepspec:spec_decode_num_drafts_total")
    draft_tokens = rate("deepspec:spec_decode_num_draft_tokens_total")
    per_pos = rate("deepspec:spec_decode_num_accepted_tokens_per_pos_total", sel=WK)
    worker_drafts = rate("deepspec:spec_decode_num_drafts_total", sel=WK)
    return dashboard(
        "deepspec-spec-decode",
        "DeepSpec / Speculative decoding",
        "How much of each draft the target accepts, and what that buys.",
        [
            panel(
                "Acceptance rate",
                [target(f"sum by (model) ({accepted}) / sum by (model) ({draft_tokens})", "{{model}}")],
                "percentunit",
                description="Accepted draft tokens / proposed draft tokens.",
            ),
            panel(
                "Mean acceptance length",
                [target(f"1 + sum by (model) ({accepted}) / sum by (model) ({drafts})", "{{model}}")],
                "short",
                description="Tokens per verify step, bonus token included: 1 + accepted / drafts. "
                "1.0 means the draft never helps.",
            ),
            panel(
                "Tokens per target forward",
                [
                    target(
                        f"sum by (model) ({rate('deepspec:spec_decode_num_forward_tokens_total', sel=WK)})"
                        f" / sum by (model) ({rate('deepspec:spec_decode_num_forwards_total', sel=WK)})",
                        "{{model}}",
                    )
                ],
                "short",
                description="Tokens committed per decode round over all rounds, drafted or not (workers' own series): "
                "what speculation bought. 1.0 means nothing, however high the acceptance length above "
                "is on the rounds that drafted.",
            ),
            panel(
                "Acceptance by draft position",
                [
                    target(
                        f"sum by (position) ({per_pos}) / ignoring(position) group_left() sum({worker_drafts})",
                        "position {{position}}",
                    ),
                ],
                "percentunit",
                kind="bargauge",
                description="Share of drafts whose token at each position was accepted; it can only fall "
                "with position.",
            ),
            panel(
                "Draft tokens per second",
                [
                    target(f"sum({draft_tokens})", "proposed"),
                    target(f"sum({accepted})", "accepted"),
                    target(f"sum({drafts})", "drafts (verify rounds with drafts)"),
                ],
                "short",
                description="Draft tokens the drafter proposed and the target accepted, per second.",
            ),
            panel(
                "Acceptance length percentiles",
                [
                    target(quantile(q, "deepspec:spec_decode_acceptance_length", sel=WK), f"p{round(q * 100)}")
                    for q in QUANTILES
                ],
                "short",
                description="τ: tokens emitted per verify round that checked drafts, bonus token included "
                "(rounds left without drafts are not counted).",
            ),
            panel(
                "Acceptance length distribution",
                [
                    target(
                        f"sum by (le) ({rate('deepspec:spec_decode_acceptance_length_bucket', sel=WK)})",
                        "{{le}}",
                        heatmap_format=True,
                    ),
                ],
                "short",
                kind="heatmap",
                description="Histogram of tokens emitted per verify round that checked drafts.",
            ),
        ],
    )


def workers() -> dict:
    def per_worker(title: str, expr: str, unit: str, description: str = "") -> dict:
        return panel(title, [target(expr, "{{worker}}")], unit, description=description)

    def per_instance(title: str, expr: str, unit: str, description: str = "") -> dict:
        return panel(title, [target(expr, "{{instance}}")], unit, description=description)

    requests = "deepspec:request_success_total"
    return dashboard(
        "deepspec-workers",
        "DeepSpec / Workers",
        "Per worker: as the gateway routes to it (`worker`) and from its own metrics (`instance`).",
        [
            row("As the gateway sees each worker"),
            per_worker("Request rate per worker", f"sum by (worker) ({rate(requests)})", "reqps"),
            per_worker(
                "Error ratio per worker",
                f"sum by (worker) ({rate(requests, ERRORS)}) / sum by (worker) ({rate(requests)})",
                "percentunit",
            ),
            per_worker(
                "p99 time to first token per worker",
                quantile(0.99, "deepspec:time_to_first_token_seconds", "worker"),
                "s",
            ),
            per_worker(
                "p99 time per output token per worker",
                quantile(0.99, "deepspec:time_per_output_token_seconds", "worker"),
                "s",
            ),
            per_worker(
                "Generated tokens per second per worker",
                f"sum by (worker) ({rate('deepspec:generation_tokens_total')})",
                "short",
            ),
            per_worker(
                "Acceptance rate per worker",
                f"sum by (worker) ({rate('deepspec:spec_decode_num_accepted_tokens_total')})"
                f" / sum by (worker) ({rate('deepspec:spec_decode_num_draft_tokens_total')})",
                "percentunit",
            ),
            per_worker(
                "Outstanding requests per worker",
                f"sum by (worker) (deepspec:gateway_num_requests_outstanding{{{ROUTING}}})",
                "short",
            ),
            per_worker(
                "Admitted to routing",
                f"min by (worker) (deepspec:gateway_worker_healthy{{{ROUTING}}})",
                "bool",
                "1 while the gateway routes to the worker, 0 while its health checks eject it.",
            ),
            per_worker(
                "Retries away from each worker",
                f"sum by (worker) ({rate('deepspec:gateway_retries_total', sel=ROUTING)})",
                "reqps",
            ),
            row("From each worker's own metrics"),
            per_instance("Running per worker", f"sum by (instance) (deepspec:num_requests_running{{{WK}}})", "short"),
            per_instance("Waiting per worker", f"sum by (instance) (deepspec:num_requests_waiting{{{WK}}})", "short"),
            per_instance(
                "p99 queue time per worker",
                quantile(0.99, "deepspec:request_queue_time_seconds", "instance", sel=WK),
                "s",
            ),
            per_instance(
                "Batch utilization per worker",
                f"sum by (instance) (deepspec:num_requests_running{{{WK}}}) / $max_batch_size",
                "percentunit",
            ),
            row("GPUs (NVIDIA DCGM exporter, when installed)"),
            panel(
                "GPU utilization",
                [target(f"avg by (pod, gpu) (DCGM_FI_DEV_GPU_UTIL{{{GPU_PODS}}}) / 100", "{{pod}} gpu {{gpu}}")],
                "percentunit",
                description="Share of time a kernel ran, per GPU of each worker pod.",
            ),
            panel(
                "GPU memory used",
                [target(f"avg by (pod, gpu) (DCGM_FI_DEV_FB_USED{{{GPU_PODS}}}) * 1048576", "{{pod}} gpu {{gpu}}")],
                "bytes",
                description="Frame-buffer memory in use per GPU (weights, KV cache, activations).",
            ),
        ],
    )


def engine() -> dict:
    """The same panels for every `worker.runtime`: the engine's own metrics, recorded under shared names by the
    chart's PrometheusRule (helm/tools/engine_metrics.py says which series of each engine feeds which)."""

    def series(name: str) -> str:
        return f"{ENGINE}{name}{{{EN}}}"

    def engine_latency(title: str, histogram: str, description: str) -> object:
        return panel(
            title,
            [
                target(
                    f"histogram_quantile({q}, sum by (le) (rate({series(histogram + '_bucket')}[{RATE}])))",
                    f"p{round(q * 100)}",
                )
                for q in QUANTILES
            ],
            "s",
            description=description,
            w=8,
        )

    return dashboard(
        "deepspec-engine",
        "DeepSpec / Engine (any runtime)",
        "The serving engine's own metrics (DeepSpec, Triton, vLLM, SGLang, TensorRT-LLM) under one set "
        "of names: the panels read the same whatever worker.runtime is.",
        [
            row("Speculative decoding"),
            panel(
                "Engine acceptance rate",
                [target(f"avg by (model) ({series(f'spec_decode_acceptance_rate:rate{WINDOW}')})", "{{model}}")],
                "percentunit",
                w=8,
                description=f"Accepted / proposed draft tokens over {WINDOW}, from the "
                "engine's counters (SGLang: its own running ratio).",
            ),
            panel(
                "Engine mean acceptance length",
                [target(f"avg by (model) ({series(f'spec_decode_mean_acceptance_length:rate{WINDOW}')})", "{{model}}")],
                "short",
                w=8,
                description="τ: tokens per verify round that checked drafts, bonus token included: "
                "1 + accepted / drafts (SGLang and TensorRT-LLM without per-request "
                "stats: the engine's mean).",
            ),
            panel(
                "Engine requests by outcome",
                [target(f"sum by (status) (rate({series('request_success_total')}[{RATE}]))", "{{status}}")],
                "reqps",
                w=8,
                stack=True,
                description="Finished requests per second by the engine's finish reason "
                "(SGLang counts them without one: `finished`).",
            ),
            row("Latency, as the engine measures it"),
            engine_latency(
                "Engine time to first token",
                "time_to_first_token_seconds",
                "Arrival at the engine to its first output token.",
            ),
            engine_latency(
                "Engine time per output token",
                "time_per_output_token_seconds",
                "Decode time per output token after the first.",
            ),
            engine_latency(
                "Engine end-to-end latency", "e2e_request_latency_seconds", "Arrival at the engine to its last token."
            ),
            row("Scheduler"),
            panel(
                "Engine requests waiting and running",
                [
                    target(f"sum by (model) ({series('num_requests_waiting')})", "waiting {{model}}"),
                    target(f"sum by (model) ({series('num_requests_running')})", "running {{model}}"),
                ],
                "short",
                w=24,
                description="Waiting: queued for a batch slot (what worker.autoscaling scales on). "
                "Running: in the batch.",
            ),
        ],
        variables(f"{ENGINE}num_requests_running", f"{ENGINE}num_requests_running"),
    )


DASHBOARDS = {
    "deepspec-overview": overview,
    "deepspec-spec-decode": spec_decode,
    "deepspec-workers": workers,
    "deepspec-engine": engine,
}


def render() -> dict[Path, str]:
    """Path -> JSON text of every dashboard."""
    return {OUT_DIR / f"{name}.json": json.dumps(build(), indent=2) + "\n" for name, build in DASHBOARDS.items()}


def main(argv: list[str] | None = None) -> int:
    return regenerate(render, argv, (__doc__ or "").partition("\n")[0], "helm/tools/dashboards.py")


if __name__ == "__main__":
    raise SystemExit(main())
