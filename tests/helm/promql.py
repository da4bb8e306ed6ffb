"""PromQL the chart ships: the alert rules (rendered from the PrometheusRule) and the Grafana panels' queries, plus
the metric names each one reads."""

from __future__ import annotations

import json
import re

from tests.docker import load_script
from tests.helm.conftest import CHART_DIR, REPO, VALUE_SETS, one, render


def tool(name: str):
    """A helm/tools module, loaded by path as the chart's generators run."""
    return load_script(f"helm_tools_{name}", REPO / "helm" / "tools" / f"{name}.py")


engine_metrics = tool("engine_metrics")

# Series that are not DeepSpec's but that a rule or panel may read, and who exports them.
EXTERNAL_METRICS = {
    "up": "Prometheus itself, one per scrape target",
    "kube_pod_container_status_restarts_total": "kube-state-metrics",
    "DCGM_FI_DEV_GPU_UTIL": "NVIDIA DCGM exporter (percent)",
    "DCGM_FI_DEV_FB_USED": "NVIDIA DCGM exporter (MiB)",
    "deepspec_llmapi_num_requests_waiting": "the exported Triton LLM-API model (worker.runtime=triton)",
    "deepspec_llmapi_num_requests_running": "the exported Triton LLM-API model (worker.runtime=triton)",
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


def rule_exprs(values: dict | None = None) -> list[tuple[str, str]]:
    """(alert or recorded name, expr) of every rule."""
    return [(r.get("alert") or r["record"], r["expr"]) for g in prometheus_rule(values)["groups"] for r in g["rules"]]


def engine_series() -> set[str]:
    """Every engine series the recording rules read, histograms with their `_bucket` suffix."""
    names = set()
    for signals in engine_metrics.RUNTIMES.values():
        for signal, source in signals.items():
            histogram = engine_metrics.SIGNALS[signal][0] == "histogram"
            names.add(source.metric + ("_bucket" if histogram else ""))
    return names


def dashboards() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((CHART_DIR / "dashboards").glob("*.json"))}


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(dashboard, panel title, expr) of every panel target."""
    return [
        (name, panel["title"], t["expr"])
        for name, d in dashboards().items()
        for panel in d["panels"]
        for t in panel.get("targets", [])
    ]


def substitute(expr: str, dashboard: dict, rate_interval: str = "1m") -> str:
    """The query Grafana sends with every variable at "All": each variable becomes its `allValue` regex."""
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            expr = expr.replace(f"${var['name']}", var["allValue"])
        elif var["type"] == "textbox":
            expr = expr.replace(f"${var['name']}", var["query"])
    return expr.replace("$__rate_interval", rate_interval)


# --- Recorded engine /metrics ---------------------------------------------------------------------------------

FIXTURES = REPO / "tests" / "helm" / "fixtures" / "engines"
#: runtime -> scrape job -> the recorded `/metrics` text that job serves. A Triton worker sits behind the DeepSpec
#: gateway, whose per-request copies carry what Triton's own metrics lack.
FIXTURE_JOBS = {
    "deepspec": {"worker": "deepspec.worker.prom"},
    "triton": {"worker": "triton.worker.prom", "gateway": "deepspec.gateway.prom"},
    "vllm": {"worker": "vllm.worker.prom"},
    "sglang": {"worker": "sglang.worker.prom"},
    "trtllm-serve": {"worker": "trtllm-serve.worker.prom", "gateway": "deepspec.gateway.prom"},
}


def fixture_samples(path_name: str) -> list[tuple[str, dict, float, bool]]:
    """(name, labels, value, cumulative) of every sample in a recorded `/metrics` file, parsed with prometheus_client's
    own text parser (so a malformed fixture fails here). `_created` timestamps are left out."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = []
    for family in text_string_to_metric_families((FIXTURES / path_name).read_text()):
        cumulative = family.type in ("counter", "histogram")
        for s in family.samples:
            if not s.name.endswith("_created"):
                samples.append((s.name, dict(s.labels), s.value, cumulative))
    return samples


def exposition(samples: list[tuple[str, dict, float, bool]], scale: float) -> str:
    """The samples in the text format with every counter and bucket multiplied by `scale`: served with a growing
    scale, the recorded file behaves like a live engine whose traffic never changes shape."""
    lines = []
    for name, labels, value, cumulative in samples:
        text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        lines.append(f"{name}{{{text}}} {value * scale if cumulative else value}")
    return "\n".join(lines) + "\n"


def fill_selectors(expr: str, release: str, namespace: str) -> str:
    """An engines.yaml expression with its job placeholders filled in as the chart's PrometheusRule fills them."""
    job = lambda component: f'job="{release}-{component}", namespace="{namespace}"'  # noqa: E731  (a one-line local helper)
    return (
        expr.replace(engine_metrics.WORKER, job("worker"))
        .replace(engine_metrics.GATEWAY, job("gateway"))
        .replace(engine_metrics.OWN, f'job=~"{release}-(gateway|worker)", namespace="{namespace}"')
    )
