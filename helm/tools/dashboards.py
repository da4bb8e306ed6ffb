"""Generate the chart's Grafana dashboards (helm/deepspec/dashboards/*.json) from one description.

    python helm/tools/dashboards.py            # rewrite the JSON files
    python helm/tools/dashboards.py --check    # exit 1 when the committed JSON is stale (tests run this)

Every query reads the gateway's copies of the metrics in service/metrics.py: they carry a `worker` label and exist
for both worker runtimes (a stock Triton worker exports none of ours). The `worker` variable's "All" value is `.+`,
so the workers' own unlabelled series are never added on top. Grafana's `$__rate_interval` keeps rates valid at
any scrape interval. Standard library only, so the chart can be regenerated from any checkout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUT_DIR = Path(__file__).resolve().parents[1] / "deepspec" / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'namespace=~"$namespace", model=~"$model", worker=~"$worker"'
RATE = "$__rate_interval"
OK_STATUS = "stop|length"  # finish reasons; every other `status` is an error kind
ERRORS = f'status!~"{OK_STATUS}"'
QUANTILES = (0.5, 0.9, 0.99)


def rate(metric: str, extra: str = "") -> str:
    """`rate(metric{selector}[$__rate_interval])`."""
    selector = SEL + (", " + extra if extra else "")
    return f"rate({metric}{{{selector}}}[{RATE}])"


def quantile(q: float, histogram: str, by: str = "") -> str:
    """p-quantile of a `deepspec:*_seconds` histogram, optionally kept apart per label."""
    keep = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({keep}) ({rate(histogram + '_bucket')}))"


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


def latency_panel(title: str, histogram: str, description: str) -> dict:
    return panel(title, [target(quantile(q, histogram), f"p{round(q * 100)}") for q in QUANTILES], "s",
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
        query_var("worker", "Worker", f'label_values({series}{{namespace=~"$namespace", model=~"$model"}}, worker)',
                  ".+"),
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
              "percentunit", description=f"Share of requests whose status is not {OK_STATUS}."),
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
                      "Time a request waited for a batch slot."),
        panel("Requests running and waiting", [
            target(f"sum(deepspec:num_requests_running{{{SEL}}})", "running"),
            target(f"sum(deepspec:num_requests_waiting{{{SEL}}})", "waiting"),
        ], "short", description="Running: in a worker's batch. Waiting: queued for a slot."),
        row("Tokens"),
        panel("Tokens per second", [
            target(f"sum({rate('deepspec:prompt_tokens_total')})", "prompt (in)"),
            target(f"sum({rate('deepspec:generation_tokens_total')})", "generated (out)"),
        ], "short", description="Prompt tokens read and tokens generated per second.", w=24),
    ])


def spec_decode() -> dict:
    accepted = rate("deepspec:spec_decode_num_accepted_tokens_total")
    drafts = rate("deepspec:spec_decode_num_drafts_total")
    draft_tokens = rate("deepspec:spec_decode_num_draft_tokens_total")
    per_pos = rate("deepspec:spec_decode_num_accepted_tokens_per_pos_total")
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
            target(f"sum by (position) ({per_pos}) / ignoring(position) group_left() sum({drafts})",
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
            target(quantile(q, "deepspec:spec_decode_acceptance_length"), f"p{round(q * 100)}") for q in QUANTILES
        ], "short", description="Tokens emitted per verify step, bonus token included."),
        panel("Acceptance length distribution", [
            target(f"sum by (le) ({rate('deepspec:spec_decode_acceptance_length_bucket')})", "{{le}}",
                   format="heatmap"),
        ], "short", kind="heatmap", description="Histogram of tokens emitted per verify step."),
    ])


def workers() -> dict:
    by = "worker"
    return dashboard("deepspec-workers", "DeepSpec / Workers",
                     "One line per worker, as the gateway sees it; pick workers with the `worker` variable.", [
        panel("Request rate per worker", [target(f"sum by (worker) ({rate('deepspec:request_success_total')})",
                                                 "{{worker}}")], "reqps"),
        panel("Error ratio per worker", [target(
            f"sum by (worker) ({rate('deepspec:request_success_total', ERRORS)})"
            f" / sum by (worker) ({rate('deepspec:request_success_total')})", "{{worker}}")], "percentunit"),
        panel("p99 time to first token per worker", [
            target(quantile(0.99, "deepspec:time_to_first_token_seconds", by), "{{worker}}")], "s"),
        panel("p99 time per output token per worker", [
            target(quantile(0.99, "deepspec:time_per_output_token_seconds", by), "{{worker}}")], "s"),
        panel("Running per worker", [target(f"sum by (worker) (deepspec:num_requests_running{{{SEL}}})",
                                            "{{worker}}")], "short"),
        panel("Waiting per worker", [target(f"sum by (worker) (deepspec:num_requests_waiting{{{SEL}}})",
                                            "{{worker}}")], "short"),
        panel("Generated tokens per second per worker", [
            target(f"sum by (worker) ({rate('deepspec:generation_tokens_total')})", "{{worker}}")], "short"),
        panel("Acceptance rate per worker", [target(
            f"sum by (worker) ({rate('deepspec:spec_decode_num_accepted_tokens_total')})"
            f" / sum by (worker) ({rate('deepspec:spec_decode_num_draft_tokens_total')})", "{{worker}}")],
              "percentunit"),
    ])


DASHBOARDS = {"deepspec-overview": overview, "deepspec-spec-decode": spec_decode, "deepspec-workers": workers}


def render() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    return {f"{name}.json": json.dumps(build(), indent=2) + "\n" for name, build in DASHBOARDS.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed JSON differs")
    args = parser.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = OUT_DIR / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print("stale dashboards (run python helm/tools/dashboards.py):", *stale, sep="\n  ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
