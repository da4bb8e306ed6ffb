"""What Prometheus runs in the end-to-end stack, and the chart's queries it must answer.

The scrape jobs carry the names the chart's ServiceMonitors give (`<release>-gateway`, `<release>-worker`) and the
`namespace` label Kubernetes discovery would attach, so the chart's rendered PrometheusRule (recording rules and
alerts) and its KEDA triggers run unchanged, and the dashboards' queries are sent the way Grafana sends them.
"""

from __future__ import annotations

from tests.helm.conftest import NAMESPACE, RELEASE, one, render
from tests.helm.promql import EXTERNAL_METRICS, dashboard_queries, dashboards, metric_names, substitute

#: the chart as a CPU deployment with its monitoring objects and KEDA autoscaling on
VALUES = {"monitoring": {"skipWithoutCRDs": False}, "worker": {"device": "cpu", "autoscaling": {"enabled": True}}}
#: Grafana's $__rate_interval, wide enough that what the fault checks caused is still in every window
RATE_INTERVAL = "5m"
#: panels this stack cannot fill, and why (matched against the panel title)
NOT_EXPECTED = {
    "429 and 503 per second": "nothing is shed: the run never overloads the gateway",
    "Retries": "a retry needs a pick of a dead worker before the gateway ejects it (0.5 s health checks): by chance",
}


def scrape_config(gateway: str, worker_alias: str, metrics_port: int, prometheus_port: int) -> dict:
    """Every container is a target: the gateway by name, the workers through the DNS name they share (as the
    headless Service's endpoints), Prometheus itself."""
    labels = {"namespace": NAMESPACE}
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["/etc/e2e/rules.yaml"],
        "scrape_configs": [
            {
                "job_name": f"{RELEASE}-gateway",
                "static_configs": [{"targets": [f"{gateway}:{metrics_port}"], "labels": labels}],
            },
            {
                "job_name": f"{RELEASE}-worker",
                "dns_sd_configs": [
                    {"names": [worker_alias], "type": "A", "port": metrics_port, "refresh_interval": "2s"}
                ],
                "relabel_configs": [{"target_label": "namespace", "replacement": NAMESPACE}],
            },
            {
                "job_name": "prometheus",
                "static_configs": [{"targets": [f"localhost:{prometheus_port}"], "labels": labels}],
            },
        ],
    }


def rules() -> dict:
    """The chart's rendered PrometheusRule spec: a Prometheus rule file."""
    return one(render(VALUES), "PrometheusRule")["spec"]


def keda_queries() -> set[tuple[str, str, str]]:
    """("keda", trigger name, query) of every trigger of the rendered ScaledObject."""
    triggers = one(render(VALUES), "ScaledObject")["spec"]["triggers"]
    return {("keda", t["name"], t["metadata"]["query"]) for t in triggers}


def panel_queries() -> tuple[set[tuple[str, str, str]], dict[tuple[str, str, str], str]]:
    """(dashboard, panel, query as Grafana sends it with every variable at "All") that must return data, and the
    ones that need not, each with the reason."""
    boards, expected, skipped = dashboards(), set(), {}
    for board, title, expr in dashboard_queries():
        item = (board, title, substitute(expr, boards[board], RATE_INTERVAL))
        external = metric_names(expr) & set(EXTERNAL_METRICS)
        reason = next((why for prefix, why in NOT_EXPECTED.items() if title.startswith(prefix)), None)
        if external:
            skipped[item] = "exported by " + "; ".join(sorted({EXTERNAL_METRICS[name] for name in external}))
        elif reason:
            skipped[item] = reason
        else:
            expected.add(item)
    return expected, skipped
