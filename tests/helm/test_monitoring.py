"""Alert rules and dashboards: promtool checks and unit-tests the rendered rules, every dashboard query parses,
every metric they name is declared in service/metrics.py, and the generated files are current."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest
import yaml

from service.metrics import ALL_METRIC_NAMES
from tests.helm.conftest import NAMESPACE, REPO, RELEASE, require_tool
from tests.helm.promql import (EXTERNAL_METRICS, base_name, dashboard_queries, dashboards, metric_names,
                               prometheus_rule, rule_exprs, substitute)

ROUTING = f'job="{RELEASE}-gateway", namespace="{NAMESPACE}", worker="10.0.0.7:8001"'
GATEWAY = f'{ROUTING}, model="smollm2-135m"'
WORKER = f'job="{RELEASE}-worker", namespace="{NAMESPACE}", model="smollm2-135m", instance="10.0.0.7:8002"'


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "helm" / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    result = subprocess.run([require_tool("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result


# --- Names --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["rules", "dashboards"])
def test_every_metric_named_is_declared_in_service_metrics(source):
    exprs = rule_exprs() if source == "rules" else [(f"{d}/{p}", e) for d, p, e in dashboard_queries()]
    assert exprs
    declared = set(ALL_METRIC_NAMES)
    used = set()
    for where, expr in exprs:
        names = metric_names(expr)
        assert names, f"{where}: no metric found in {expr!r}"
        for name in names:
            if name.startswith("deepspec:"):
                assert base_name(name) in declared, f"{where}: {name} is not in service/metrics.py"
                used.add(base_name(name))
            else:
                assert source == "rules" and name in EXTERNAL_METRICS, f"{where}: unknown series {name}"
    if source == "dashboards":
        assert used == declared, f"metrics no dashboard shows: {sorted(declared - used)}"


def test_dashboards_cover_the_required_panels():
    boards = dashboards()
    titles = {p["title"]: (name, p) for name, d in boards.items() for p in d["panels"]}
    for latency in ("Time to first token", "Inter-token latency", "Time per output token",
                    "End-to-end request latency", "Queue time"):
        legends = [t["legendFormat"] for t in titles[latency][1]["targets"]]
        assert legends == ["p50", "p90", "p99"], latency
    for required in ("Request rate by status", "Error ratio", "Requests running and waiting", "Tokens per second",
                     "Acceptance rate", "Mean acceptance length", "Acceptance by draft position",
                     "Draft tokens per second"):
        assert required in titles
    assert "by (position)" in titles["Acceptance by draft position"][1]["targets"][0]["expr"]
    assert "1 + " in titles["Mean acceptance length"][1]["targets"][0]["expr"]
    workers = boards["deepspec-workers"]
    assert {v["name"] for v in workers["templating"]["list"]} >= {"datasource", "worker", "model", "namespace"}
    for p in workers["panels"]:  # every panel splits by worker, one way or the other
        for t in p.get("targets", []):
            assert any(by in t["expr"] for by in ("by (worker)", "le, worker", "by (instance)", "le, instance"))
    for name, d in boards.items():
        assert d["uid"] == name and len(d["uid"]) <= 40
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids))
        assert all(t["datasource"]["uid"] == "${datasource}" for p in d["panels"] for t in p.get("targets", []))


def test_generated_dashboards_and_values_docs_are_current():
    assert _tool("dashboards").main(["--check"]) == 0, "run python helm/tools/dashboards.py"
    assert _tool("values_docs").main(["--check"]) == 0, "run python helm/tools/values_docs.py"


def test_every_value_is_documented():
    tool = _tool("values_docs")
    text = (REPO / "helm" / "deepspec" / "values.yaml").read_text()
    undocumented = [path for path, entry in tool.parse_comments(text, yaml.safe_load(text)).items()
                    if not entry["description"] and isinstance(_lookup(yaml.safe_load(text), path), (str, int, float,
                                                                                                     bool, list))]
    assert not undocumented, f"values without a `# --` line: {undocumented}"


def _lookup(values, dotted):
    for key in dotted.split("."):
        values = values[key]
    return values


# --- promtool -----------------------------------------------------------------------------------------------


def test_promtool_checks_the_rendered_rules(tmp_path):
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(prometheus_rule(), sort_keys=False))
    result = promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert "SUCCESS: 7 rules found" in result.stdout


def test_every_dashboard_query_parses(tmp_path):
    """promtool parses each panel query (with Grafana's variables at "All") as a recording rule's expression."""
    boards = dashboards()
    rules = [{"record": f"dashboard:query_{i}:check", "expr": substitute(expr, boards[name])}
             for i, (name, _, expr) in enumerate(dashboard_queries())]
    (tmp_path / "dashboards.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = promtool("check", "rules", "dashboards.yaml", cwd=tmp_path)
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def _alert_rules_without_annotations() -> dict:
    """The rendered rules with annotations dropped: the unit tests below check when alerts fire, not their text
    (`promtool check rules` above already validates the annotation templates)."""
    groups = prometheus_rule()["groups"]
    for group in groups:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return {"groups": groups}


def _firing(alert: str, eval_time: str, *labels: dict) -> dict:
    return {"eval_time": eval_time, "alertname": alert, "exp_alerts": [{"exp_labels": dict(l)} for l in labels]}


MODEL = {"model": "smollm2-135m"}
ALERT_TESTS = [
    {   # 10 % of draft tokens accepted: the draft stopped matching the target.
        "name": "acceptance collapse",
        "input_series": [
            {"series": f"deepspec:spec_decode_num_draft_tokens_total{{{GATEWAY}}}", "values": "0+700x40"},
            {"series": f"deepspec:spec_decode_num_accepted_tokens_total{{{GATEWAY}}}", "values": "0+70x40"},
        ],
        "alert_rule_test": [_firing("DeepSpecAcceptanceRateCollapse", "30m", {**MODEL, "severity": "warning"})],
    },
    {   # 80 % accepted, 1 % errors: quiet.
        "name": "healthy speculation",
        "input_series": [
            {"series": f"deepspec:spec_decode_num_draft_tokens_total{{{GATEWAY}}}", "values": "0+700x40"},
            {"series": f"deepspec:spec_decode_num_accepted_tokens_total{{{GATEWAY}}}", "values": "0+560x40"},
            {"series": f'deepspec:request_success_total{{{GATEWAY}, status="stop"}}', "values": "0+99x40"},
            {"series": f'deepspec:request_success_total{{{GATEWAY}, status="error"}}', "values": "0+1x40"},
            {"series": f'up{{job="{RELEASE}-gateway", namespace="{NAMESPACE}"}}', "values": "1x40"},
            {"series": f'up{{job="{RELEASE}-worker", namespace="{NAMESPACE}"}}', "values": "1x40"},
        ],
        "alert_rule_test": [_firing(a, "30m") for a in (
            "DeepSpecAcceptanceRateCollapse", "DeepSpecHighErrorRate", "DeepSpecWorkersDown", "DeepSpecGatewayDown")],
    },
    {   # 10 % of requests end in an error kind; finish reasons stop and length are not errors.
        "name": "error rate",
        "input_series": [
            {"series": f'deepspec:request_success_total{{{GATEWAY}, status="stop"}}', "values": "0+60x30"},
            {"series": f'deepspec:request_success_total{{{GATEWAY}, status="length"}}', "values": "0+30x30"},
            {"series": f'deepspec:request_success_total{{{GATEWAY}, status="error"}}', "values": "0+10x30"},
        ],
        "alert_rule_test": [_firing("DeepSpecHighErrorRate", "20m", {**MODEL, "severity": "critical"})],
    },
    {   # Every first token lands between 2.5 s and 5 s.
        "name": "slow first token",
        "input_series": [
            *({"series": f'deepspec:time_to_first_token_seconds_bucket{{{GATEWAY}, le="{le}"}}', "values": "0x30"}
              for le in ("0.5", "1", "2.5")),
            *({"series": f'deepspec:time_to_first_token_seconds_bucket{{{GATEWAY}, le="{le}"}}', "values": "0+50x30"}
              for le in ("5", "+Inf")),
        ],
        "alert_rule_test": [_firing("DeepSpecHighTimeToFirstToken", "20m", {**MODEL, "severity": "warning"})],
    },
    {   # The queue grows by 2 requests a minute and passes 32 after 16 minutes.
        "name": "queue growing",
        "input_series": [{"series": f"deepspec:num_requests_waiting{{{WORKER}}}", "values": "0+2x40"}],
        "alert_rule_test": [_firing("DeepSpecQueueGrowing", "15m"),
                            _firing("DeepSpecQueueGrowing", "30m", {**MODEL, "severity": "warning"})],
    },
    {   # The only worker is ejected by the gateway at minute 10; its metrics endpoint stops answering too.
        "name": "workers gone",
        "input_series": [
            {"series": f'deepspec:gateway_worker_healthy{{{ROUTING}}}', "values": "1x10 0x20"},
            {"series": f'up{{job="{RELEASE}-worker", namespace="{NAMESPACE}"}}', "values": "1x10 0x20"},
            {"series": f'up{{job="{RELEASE}-gateway", namespace="{NAMESPACE}"}}', "values": "1x30"},
        ],
        "alert_rule_test": [
            _firing("DeepSpecNoReadyWorkers", "12m"),
            _firing("DeepSpecNoReadyWorkers", "20m", {"severity": "critical"}),
            _firing("DeepSpecWorkersDown", "20m", {"severity": "critical"}),
            _firing("DeepSpecGatewayDown", "20m"),
        ],
    },
    {   # No target at all (never scheduled): absence is down, not silence.
        "name": "never scraped",
        "input_series": [{"series": 'up{job="something-else"}', "values": "1x20"}],
        "alert_rule_test": [_firing("DeepSpecGatewayDown", "10m", {"severity": "critical"}),
                            _firing("DeepSpecWorkersDown", "10m", {"severity": "critical"})],
    },
]


def test_alerts_fire_when_they_should_and_only_then(tmp_path):
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(_alert_rules_without_annotations(), sort_keys=False))
    tests = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
             "tests": [{"interval": "1m", **{k: v for k, v in t.items() if k != "name"}} for t in ALERT_TESTS]}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    promtool("test", "rules", "tests.yaml", cwd=tmp_path)


def test_rules_follow_the_thresholds_in_values():
    spec = prometheus_rule({"monitoring": {"skipWithoutCRDs": False, "prometheusRule": {
        "ttftP99Seconds": 0.75, "minAcceptanceRate": 0.35, "for": "3m", "alertLabels": {"team": "inference"}}}})
    rules = {r["alert"]: r for r in spec["groups"][0]["rules"]}
    assert rules["DeepSpecHighTimeToFirstToken"]["expr"].rstrip().endswith("> 0.75")
    assert rules["DeepSpecAcceptanceRateCollapse"]["expr"].rstrip().endswith("< 0.35")
    assert rules["DeepSpecHighTimeToFirstToken"]["for"] == "3m"
    assert all(r["labels"]["team"] == "inference" for r in rules.values())
