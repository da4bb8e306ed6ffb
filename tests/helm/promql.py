"""PromQL the chart ships: the alert rules (rendered from the PrometheusRule) and the Grafana panels' queries, plus
the metric names each one reads."""

from __future__ import annotations

import json
import re

from tests.helm.conftest import CHART_DIR, VALUE_SETS, one, render

# Series that are not DeepSpec's but that a rule or panel may read, and who exports them.
EXTERNAL_METRICS = {
    "up": "Prometheus itself, one per scrape target",
    "kube_pod_container_status_restarts_total": "kube-state-metrics",
    "DCGM_FI_DEV_GPU_UTIL": "NVIDIA DCGM exporter (percent)",
    "DCGM_FI_DEV_FB_USED": "NVIDIA DCGM exporter (MiB)",
    "nv_inference_pending_request_count": "Triton (worker.runtime=triton)",
    "nv_trt_llm_request_metrics": "Triton's TensorRT-LLM backend (worker.runtime=triton)",
}
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_SELECTED = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{")
_COLON_NAMES = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]*")
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def metric_names(expr: str) -> set[str]:
    """Series names an expression reads: every name before a `{` selector and every `deepspec:`-style name."""
    code = _STRINGS.sub('""', expr)
    return set(_SELECTED.findall(code)) | set(_COLON_NAMES.findall(code))


def base_name(name: str) -> str:
    """`deepspec:x_seconds_bucket` -> `deepspec:x_seconds` (the name service/metrics.py declares)."""
    for suffix in _HISTOGRAM_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def prometheus_rule(values: dict | None = None) -> dict:
    """The rendered PrometheusRule's spec: a valid Prometheus rule file (`groups: [...]`)."""
    return one(render(values if values is not None else VALUE_SETS["gpu"]), "PrometheusRule")["spec"]


def rule_exprs() -> list[tuple[str, str]]:
    return [(r["alert"], r["expr"]) for g in prometheus_rule()["groups"] for r in g["rules"]]


def dashboards() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((CHART_DIR / "dashboards").glob("*.json"))}


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(dashboard, panel title, expr) of every panel target."""
    return [(name, panel["title"], t["expr"]) for name, d in dashboards().items()
            for panel in d["panels"] for t in panel.get("targets", [])]


def substitute(expr: str, dashboard: dict, rate_interval: str = "1m") -> str:
    """The query Grafana sends with every variable at "All": each variable becomes its `allValue` regex."""
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            expr = expr.replace(f"${var['name']}", var["allValue"])
        elif var["type"] == "textbox":
            expr = expr.replace(f"${var['name']}", var["query"])
    return expr.replace("$__rate_interval", rate_interval)
