"""Alert rules and dashboards: promtool checks and unit-tests the rendered rules, every dashboard query parses,
every metric they name is declared in service/metrics.py, and the generated files are current."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from service.metrics import ALL_METRIC_NAMES
from tests.helm.conftest import NAMESPACE, RELEASE, REPO, VALUE_SETS, require_tool
from tests.helm.promql import (
    EXTERNAL_METRICS,
    FIXTURE_JOBS,
    base_name,
    dashboard_queries,
    dashboards,
    engine_metrics,
    engine_series,
    fill_selectors,
    fixture_samples,
    metric_names,
    prometheus_rule,
    rule_exprs,
    substitute,
    tool,
)

ROUTING = f'job="{RELEASE}-gateway", namespace="{NAMESPACE}", worker="10.0.0.7:8001"'
GATEWAY = f'{ROUTING}, model="smollm2-135m"'
WORKER = f'job="{RELEASE}-worker", namespace="{NAMESPACE}", model="smollm2-135m", instance="10.0.0.7:8002"'


_tool = tool


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
            elif name.startswith(engine_metrics.PREFIX):
                assert name in engine_metrics.recorded_names(), f"{where}: no recording rule writes {name}"
            else:
                assert name in EXTERNAL_METRICS or name in engine_series(), f"{where}: unknown series {name}"
    if source == "dashboards":
        assert used == declared, f"metrics no dashboard shows: {sorted(declared - used)}"


def test_dashboards_cover_the_required_panels():
    boards = dashboards()
    titles = {p["title"]: (name, p) for name, d in boards.items() for p in d["panels"]}
    for latency in (
        "Time to first token",
        "Inter-token latency",
        "Time per output token",
        "End-to-end request latency",
        "Queue time",
    ):
        legends = [t["legendFormat"] for t in titles[latency][1]["targets"]]
        assert legends == ["p50", "p90", "p99"], latency
    for required in (
        "Request rate by status",
        "Error ratio",
        "Requests running and waiting",
        "Tokens per second",
        "Acceptance rate",
        "Mean acceptance length",
        "Acceptance by draft position",
        "Draft tokens per second",
        "429 and 503 per second",
        "Container restarts",
        "Batch utilization",
        "Batch utilization per worker",
        "GPU utilization",
        "GPU memory used",
    ):
        assert required in titles, required
    rejected = {t["legendFormat"]: t["expr"] for t in titles["429 and 503 per second"][1]["targets"]}
    assert set(rejected) == {"429", "503"} and "server_busy" in rejected["429"] and "no_worker" in rejected["503"]
    assert "kube_pod_container_status_restarts_total" in titles["Container restarts"][1]["targets"][0]["expr"]
    assert "DCGM_FI_DEV_GPU_UTIL" in titles["GPU utilization"][1]["targets"][0]["expr"]
    assert "$max_batch_size" in titles["Batch utilization"][1]["targets"][0]["expr"]
    # The error ratio counts server errors only: the finish reasons, 4xx kinds and 429 never match it.
    error_expr = titles["Error ratio"][1]["targets"][0]["expr"]
    assert 'status=~"' in error_expr and not any(s in error_expr for s in ("server_busy", "invalid_request", "abort"))
    assert "by (position)" in titles["Acceptance by draft position"][1]["targets"][0]["expr"]
    assert "1 + " in titles["Mean acceptance length"][1]["targets"][0]["expr"]
    workers = boards["deepspec-workers"]
    assert {v["name"] for v in workers["templating"]["list"]} >= {"datasource", "worker", "model", "namespace"}
    for p in workers["panels"]:  # every panel splits by worker, one way or the other
        for t in p.get("targets", []):
            assert any(
                by in t["expr"]
                for by in ("by (worker)", "le, worker", "by (instance)", "le, instance", "by (pod, gpu)")
            )
    for name, d in boards.items():
        assert d["uid"] == name and len(d["uid"]) <= 40
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids))
        assert all(t["datasource"]["uid"] == "${datasource}" for p in d["panels"] for t in p.get("targets", []))


def test_generated_dashboards_and_values_docs_are_current():
    assert _tool("dashboards").main(["--check"]) == 0, "run python helm/tools/dashboards.py"
    assert _tool("engine_metrics").main(["--check"]) == 0, "run python helm/tools/engine_metrics.py"
    assert _tool("values_docs").main(["--check"]) == 0, "run python helm/tools/values_docs.py"


def test_every_value_is_documented():
    tool = _tool("values_docs")
    text = (REPO / "helm" / "deepspec" / "values.yaml").read_text()
    undocumented = [
        path
        for path, entry in tool.parse_comments(text, yaml.safe_load(text)).items()
        if not entry["description"] and isinstance(_lookup(yaml.safe_load(text), path), (str, int, float, bool, list))
    ]
    assert not undocumented, f"values without a `# --` line: {undocumented}"


def _lookup(values, dotted):
    for key in dotted.split("."):
        values = values[key]
    return values


# --- promtool -----------------------------------------------------------------------------------------------


def test_promtool_checks_the_rendered_rules(tmp_path):
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(prometheus_rule(), sort_keys=False))
    result = promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    num_recorded = len(engine_metrics.recording_rules("deepspec"))
    assert f"SUCCESS: {len(ALERTS) + num_recorded} rules found" in result.stdout


def test_every_dashboard_query_parses(tmp_path):
    """promtool parses each panel query (with Grafana's variables at "All") as a recording rule's expression."""
    boards = dashboards()
    rules = [
        {"record": f"dashboard:query_{i}:check", "expr": substitute(expr, boards[name])}
        for i, (name, _, expr) in enumerate(dashboard_queries())
    ]
    (tmp_path / "dashboards.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = promtool("check", "rules", "dashboards.yaml", cwd=tmp_path)
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def _alert_rules_without_annotations(values: dict | None = None) -> dict:
    """The rendered rules with annotations dropped: the unit tests below check when alerts fire, not their text
    (`promtool check rules` above already validates the annotation templates)."""
    groups = prometheus_rule(values)["groups"]
    for group in groups:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return {"groups": groups}


def _firing(alert: str, eval_time: str, *labels: dict) -> dict:
    return {
        "eval_time": eval_time,
        "alertname": alert,
        "exp_alerts": [{"exp_labels": dict(label_set)} for label_set in labels],
    }


MODEL = {"model": "smollm2-135m"}
ALERTS = (
    "DeepSpecHighTimeToFirstToken",
    "DeepSpecSlowDecode",
    "DeepSpecHighErrorRate",
    "DeepSpecSaturated",
    "DeepSpecWorkerEjected",
    "DeepSpecPodRestarting",
    "DeepSpecAcceptanceRateCollapse",
    "DeepSpecNoReadyWorkers",
    "DeepSpecWorkersDown",
    "DeepSpecGatewayDown",
    "DeepSpecQueueGrowing",
)
UP = [
    {"series": f'up{{job="{RELEASE}-gateway", namespace="{NAMESPACE}"}}', "values": "1x40"},
    {"series": f'up{{job="{RELEASE}-worker", namespace="{NAMESPACE}"}}', "values": "1x40"},
    {"series": f"deepspec:gateway_worker_healthy{{{ROUTING}}}", "values": "1x40"},
]


def _status(status: str, per_minute: int, where: str = GATEWAY) -> dict:
    return {"series": f'deepspec:request_success_total{{{where}, status="{status}"}}', "values": f"0+{per_minute}x40"}


def _restarts(pod: str, values: str, container: str = "worker") -> dict:
    return {
        "series": f'kube_pod_container_status_restarts_total{{job="kube-state-metrics", namespace="{NAMESPACE}", '
        f'pod="{pod}", container="{container}"}}',
        "values": values,
    }


def _ttft(where: str, slow: bool) -> list[dict]:
    """TTFT buckets where every first token lands in 2.5-5 s (slow) or under 0.5 s."""
    return [
        {
            "series": f'deepspec:time_to_first_token_seconds_bucket{{{where}, le="{le}"}}',
            "values": "0+50x30" if (not slow or le in ("5", "+Inf")) else "0x30",
        }
        for le in ("0.5", "1", "2.5", "5", "+Inf")
    ]


def _tpot(where: str, metric: str, slow: bool) -> list[dict]:
    """Time-per-output-token buckets where every token takes 0.5-1 s (slow) or under 0.05 s."""
    return [
        {
            "series": f'{metric}_bucket{{{where}, le="{le}"}}',
            "values": "0+500x30" if (not slow or le in ("1", "+Inf")) else "0x30",
        }
        for le in ("0.05", "0.1", "0.5", "1", "+Inf")
    ]


ALERT_TESTS = [
    {  # 10 % of draft tokens accepted: the draft stopped matching the target.
        "name": "acceptance collapse",
        "input_series": [
            {"series": f"deepspec:spec_decode_num_draft_tokens_total{{{GATEWAY}}}", "values": "0+700x40"},
            {"series": f"deepspec:spec_decode_num_accepted_tokens_total{{{GATEWAY}}}", "values": "0+70x40"},
        ],
        "alert_rule_test": [_firing("DeepSpecAcceptanceRateCollapse", "30m", {**MODEL, "severity": "warning"})],
    },
    {  # A healthy service: 80 % accepted, 1 % server errors, fast first tokens, few restarts: every alert quiet.
        "name": "healthy service",
        "input_series": [
            {"series": f"deepspec:spec_decode_num_draft_tokens_total{{{GATEWAY}}}", "values": "0+700x40"},
            {"series": f"deepspec:spec_decode_num_accepted_tokens_total{{{GATEWAY}}}", "values": "0+560x40"},
            _status("stop", 99),
            _status("worker_error", 1),
            _status("server_busy", 2),
            *_ttft(GATEWAY, slow=False),
            *_ttft(WORKER, slow=False),
            {"series": f"deepspec:num_requests_waiting{{{WORKER}}}", "values": "3x40"},
            _restarts(f"{RELEASE}-worker-5c6b7-x2x9z", "0x10 1x30"),  # one restart: not a crash loop
            *UP,
        ],
        "alert_rule_test": [_firing(a, t) for a in ALERTS for t in ("20m", "35m")],
    },
    {  # 10 % of requests end in a server error kind (finish reasons stop and length are not errors).
        "name": "server error rate",
        "input_series": [
            _status("stop", 60),
            _status("length", 30),
            _status("worker_failed", 5),
            _status("internal_error", 5),
        ],
        "alert_rule_test": [_firing("DeepSpecHighErrorRate", "20m", {**MODEL, "severity": "critical"})],
    },
    {  # Half the traffic is the clients' fault or their choice (4xx, aborts) and 30 % is turned away with 429:
        # no error alert (nothing is broken), but a saturation warning (add workers).
        "name": "client noise and saturation",
        "input_series": [
            _status("stop", 20),
            _status("invalid_request_error", 10),
            _status("context_length_exceeded", 5),
            _status("model_not_found", 5),
            _status("invalid_api_key", 5),
            _status("abort", 10),
            _status("aborted", 5),
            _status("server_busy", 30),
        ],
        "alert_rule_test": [
            _firing("DeepSpecHighErrorRate", "30m"),
            _firing("DeepSpecSaturated", "30m", {**MODEL, "severity": "warning"}),
        ],
    },
    {  # Streamed first tokens between 2.5 s and 5 s, as the gateway times them.
        "name": "slow first token, streaming",
        "input_series": _ttft(GATEWAY, slow=True),
        "alert_rule_test": [_firing("DeepSpecHighTimeToFirstToken", "20m", {**MODEL, "severity": "warning"})],
    },
    {  # Non-streaming requests: the gateway sees no first chunk, the workers time their first token (slow);
        # the streamed ones are fast. The alert still fires.
        "name": "slow first token, non-streaming",
        "input_series": [*_ttft(GATEWAY, slow=False), *_ttft(WORKER, slow=True)],
        "alert_rule_test": [_firing("DeepSpecHighTimeToFirstToken", "20m", {**MODEL, "severity": "warning"})],
    },
    {  # Streamed tokens arrive fast at the gateway, but the worker's own histogram (recorded under
        # deepspec_engine:, as every runtime's is) says 0.5-1 s per token: the alert fires.
        "name": "slow decode, engine's own histogram",
        "input_series": [
            *_tpot(GATEWAY, "deepspec:time_per_output_token_seconds", slow=False),
            *_tpot(WORKER, "deepspec:time_per_output_token_seconds", slow=True),
        ],
        "alert_rule_test": [_firing("DeepSpecSlowDecode", "20m", {**MODEL, "severity": "warning"})],
    },
    {  # Fast tokens everywhere: quiet.
        "name": "fast decode",
        "input_series": [
            *_tpot(GATEWAY, "deepspec:time_per_output_token_seconds", slow=False),
            *_tpot(WORKER, "deepspec:time_per_output_token_seconds", slow=False),
        ],
        "alert_rule_test": [_firing("DeepSpecSlowDecode", "20m")],
    },
    {  # The queue grows by 2 requests a minute and passes 32 after 16 minutes.
        "name": "queue growing",
        "input_series": [{"series": f"deepspec:num_requests_waiting{{{WORKER}}}", "values": "0+2x40"}],
        "alert_rule_test": [
            _firing("DeepSpecQueueGrowing", "15m"),
            _firing("DeepSpecQueueGrowing", "30m", {**MODEL, "severity": "warning"}),
        ],
    },
    {  # A worker restarts every minute (crash loop); another release's pod restarting is not ours.
        "name": "restarts",
        "input_series": [
            _restarts(f"{RELEASE}-worker-5c6b7-x2x9z", "0+1x30"),
            _restarts("other-worker-7f8d9-abcde", "0+1x30"),
        ],
        "alert_rule_test": [
            _firing(
                "DeepSpecPodRestarting",
                "20m",
                {"pod": f"{RELEASE}-worker-5c6b7-x2x9z", "container": "worker", "severity": "warning"},
            )
        ],
    },
    {  # The only worker is ejected by the gateway at minute 10; its metrics endpoint stops answering too.
        "name": "workers gone",
        "input_series": [
            {"series": f"deepspec:gateway_worker_healthy{{{ROUTING}}}", "values": "1x10 0x20"},
            {"series": f'up{{job="{RELEASE}-worker", namespace="{NAMESPACE}"}}', "values": "1x10 0x20"},
            {"series": f'up{{job="{RELEASE}-gateway", namespace="{NAMESPACE}"}}', "values": "1x30"},
        ],
        "alert_rule_test": [
            _firing("DeepSpecNoReadyWorkers", "12m"),
            _firing("DeepSpecNoReadyWorkers", "20m", {"severity": "critical"}),
            _firing("DeepSpecWorkersDown", "20m", {"severity": "critical"}),
            _firing("DeepSpecWorkerEjected", "25m", {"worker": "10.0.0.7:8001", "severity": "warning"}),
            _firing("DeepSpecGatewayDown", "20m"),
        ],
    },
    {  # No target at all (never scheduled): absence is down, not silence.
        "name": "never scraped",
        "input_series": [{"series": 'up{job="something-else"}', "values": "1x20"}],
        "alert_rule_test": [
            _firing("DeepSpecGatewayDown", "10m", {"severity": "critical"}),
            _firing("DeepSpecWorkersDown", "10m", {"severity": "critical"}),
        ],
    },
]


def test_every_alert_has_a_test_that_fires_it():
    rules = [r["alert"] for g in prometheus_rule()["groups"] for r in g["rules"] if "alert" in r]
    assert sorted(rules) == sorted(ALERTS)
    fired = {t["alertname"] for case in ALERT_TESTS for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert fired == set(ALERTS)


def _promtool_test(tmp_path, rules: dict, cases: list[dict]) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", **{k: v for k, v in t.items() if k != "name"}} for t in cases],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    promtool("test", "rules", "tests.yaml", cwd=tmp_path)


def test_alerts_fire_when_they_should_and_only_then(tmp_path):
    _promtool_test(tmp_path, _alert_rules_without_annotations(), ALERT_TESTS)


def test_triton_queue_alert_reads_the_exported_models_gauge(tmp_path):
    """With worker.runtime=triton the queue is `deepspec_llmapi_num_requests_waiting`, which the exported LLM-API
    model emits (Triton's own pending count stays near 0 for a decoupled Python model)."""
    rules = _alert_rules_without_annotations(VALUE_SETS["triton"])
    triton_worker = f'job="{RELEASE}-worker", namespace="{NAMESPACE}", model="ensemble"'
    _promtool_test(
        tmp_path,
        rules,
        [
            {
                "input_series": [
                    {"series": f"deepspec_llmapi_num_requests_waiting{{{triton_worker}}}", "values": "0+2x40"},
                    {"series": f"deepspec:num_requests_waiting{{{WORKER}}}", "values": "0+2x40"},
                ],
                "alert_rule_test": [
                    _firing("DeepSpecQueueGrowing", "30m", {"model": "ensemble", "severity": "warning"})
                ],
            }
        ],
    )


def test_rules_follow_the_thresholds_in_values():
    spec = prometheus_rule(
        {
            "monitoring": {
                "skipWithoutCRDs": False,
                "prometheusRule": {
                    "ttftP99Seconds": 0.75,
                    "tpotP99Seconds": 0.125,
                    "minAcceptanceRate": 0.35,
                    "for": "3m",
                    "alertLabels": {"team": "inference"},
                    "saturationRatio": 0.25,
                    "maxRestarts": 5,
                    "errorStatusRegex": "internal_error",
                },
            }
        }
    )
    rules = {r["alert"]: r for g in spec["groups"] for r in g["rules"] if "alert" in r}
    assert rules["DeepSpecHighTimeToFirstToken"]["expr"].count("> 0.75") == 2  # streaming and non-streaming
    assert rules["DeepSpecSlowDecode"]["expr"].count("> 0.125") == 2  # the gateway's and the engine's
    assert rules["DeepSpecSaturated"]["expr"].rstrip().endswith("> 0.25")
    assert rules["DeepSpecPodRestarting"]["expr"].rstrip().endswith("> 5")
    assert 'status=~"internal_error"' in rules["DeepSpecHighErrorRate"]["expr"]
    assert rules["DeepSpecAcceptanceRateCollapse"]["expr"].count("< 0.35") == 2  # the gateway's and the engine's
    assert rules["DeepSpecHighTimeToFirstToken"]["for"] == "3m"
    assert all(r["labels"]["team"] == "inference" for r in rules.values())


# --- Each runtime's own metrics ---------------------------------------------------------------------------------

ENGINE_MODEL = "Qwen/Qwen3-8B"
#: what the recorded fixtures of each runtime hold (per minute in the promtool series below): the numbers the
#: normalised series must come out with. Acceptance: 12600 of 18000 draft tokens in 6000 drafts (0.7; 3.1 tokens per
#: verify round), the DeepSpec worker's 13500 (0.75; 3.25), SGLang's gauges 0.7 and 3.1. TensorRT-LLM's last-iteration
#: gauge says 2.9: its counters, where present, win.
EXPECTED = {
    "deepspec": {
        "model": "smollm2-135m",
        "spec_model": "smollm2-135m",
        "spec_job": "worker",
        "rate": 0.75,
        "length": 3.25,
        "per_forward": 3.0,
        "statuses": {"stop": 153, "length": 39},
    },
    "triton": {
        "model": "tensorrt_llm",
        "spec_model": "smollm2-135m",
        "spec_job": "gateway",
        "rate": 0.7,
        "length": 3.1,
        "statuses": {"stop": 153, "length": 39},
    },
    "vllm": {
        "model": ENGINE_MODEL,
        "spec_model": ENGINE_MODEL,
        "spec_job": "worker",
        "rate": 0.7,
        "length": 3.1,
        "statuses": {"stop": 150, "length": 40, "abort": 2},
    },
    "sglang": {
        "model": ENGINE_MODEL,
        "spec_model": ENGINE_MODEL,
        "spec_job": "worker",
        "rate": 0.7,
        "length": 3.1,
        "statuses": {"finished": 192},
    },
    # 1.2.1 exports no speculative-decoding series: no acceptance to record
    "trtllm-serve": {
        "model": ENGINE_MODEL,
        "spec_model": ENGINE_MODEL,
        "spec_job": "worker",
        "statuses": {"stop": 150, "length": 42},
    },
}


def _engine_rules(runtime: str) -> dict:
    rules = [
        {**r, "expr": fill_selectors(r["expr"], RELEASE, NAMESPACE)} for r in engine_metrics.recording_rules(runtime)
    ]
    return {"groups": [{"name": "deepspec.engine", "rules": rules}]}


def _fixture_series(runtime: str, minutes: int = 15) -> list[dict]:
    """The recorded `/metrics` of each of the runtime's scrape jobs as promtool input: counters and buckets grow by
    their recorded value every minute, gauges hold theirs."""
    series = []
    for job, fixture in FIXTURE_JOBS[runtime].items():
        for name, labels, value, cumulative in fixture_samples(fixture):
            scraped = {**labels, "job": f"{RELEASE}-{job}", "namespace": NAMESPACE}
            text = ", ".join(f'{k}="{v}"' for k, v in scraped.items())
            values = f"0+{value:g}x{minutes}" if cumulative else f"{value:g}x{minutes}"
            series.append({"series": f"{name}{{{text}}}", "values": values})
    return series


@pytest.mark.parametrize("runtime", sorted(engine_metrics.RUNTIMES))
def test_recording_rules_normalise_each_runtimes_metrics(tmp_path, runtime):
    """The runtime's recorded `/metrics` (tests/helm/fixtures/engines, in the engine's own names, labels and help
    texts, read in: vllm-project/vllm vllm/v1/metrics/loggers.py PrometheusStatLogger and
    vllm/v1/spec_decode/metrics.py SpecDecodingProm; sgl-project/sglang python/sglang/srt/metrics/collector.py
    SchedulerMetricsCollector / TokenizerMetricsCollector; NVIDIA/TensorRT-LLM tensorrt_llm/metrics/collector.py
    MetricsCollector; Triton's core metrics and the TensorRT-LLM backend's nv_trt_llm_request_metrics) come out of
    the recording rules as the same `deepspec_engine:` series with the model in `model`: queue, batch, acceptance
    rate, mean acceptance length, the three latency histograms and the request outcomes."""
    want = EXPECTED[runtime]
    model, spec = {"model": want["model"]}, {"model": want["spec_model"]}
    spec_labels = {**spec, "job": f"{RELEASE}-{want['spec_job']}", "namespace": NAMESPACE}

    def sample(labels: dict, value: float) -> dict:
        return {"labels": "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "value": value}

    latency_model = spec if runtime == "triton" else model  # Triton's latencies are the gateway's copies
    signals = engine_metrics.RUNTIMES[runtime]
    # the gateway's outstanding count (trtllm-serve 1.2.1's stand-in) is per worker, not per model
    running_labels = {} if signals["num_requests_running"].job == "gateway" else model
    expr_tests = [
        {
            "expr": "sum by (model) (deepspec_engine:num_requests_running)",
            "eval_time": "10m",
            "exp_samples": [sample(running_labels, 6)],
        },
        {
            "expr": "sum by (model, status) (deepspec_engine:request_success_total)",
            "eval_time": "10m",
            "exp_samples": [
                sample({**latency_model, "status": status}, 10 * n) for status, n in want["statuses"].items()
            ],
        },
    ]
    if "num_requests_waiting" in signals:
        expr_tests.append(
            {
                "expr": "sum by (model) (deepspec_engine:num_requests_waiting)",
                "eval_time": "10m",
                "exp_samples": [sample(model, 3)],
            }
        )
    if "rate" in want:  # rounded: a ratio of two rates is 0.75 only to within a rounding error
        expr_tests += [
            {
                "expr": "round(deepspec_engine:spec_decode_acceptance_rate:rate5m, 0.001)",
                "eval_time": "10m",
                "exp_samples": [sample(spec_labels, want["rate"])],
            },
            {
                "expr": "round(deepspec_engine:spec_decode_mean_acceptance_length:rate5m, 0.001)",
                "eval_time": "10m",
                "exp_samples": [sample(spec_labels, want["length"])],
            },
        ]
    if "per_forward" in want:  # only an engine that counts its rounds without drafts can say it
        expr_tests.append(
            {
                "expr": "round(deepspec_engine:spec_decode_tokens_per_forward:rate5m, 0.001)",
                "eval_time": "10m",
                "exp_samples": [sample(spec_labels, want["per_forward"])],
            }
        )
    for histogram in ("time_to_first_token_seconds", "time_per_output_token_seconds", "e2e_request_latency_seconds"):
        expr_tests.append(
            {
                "expr": f'count by (model) (deepspec_engine:{histogram}_bucket{{le="+Inf"}})',
                "eval_time": "10m",
                "exp_samples": [sample(latency_model, 1)],
            }
        )
    _promtool_test(
        tmp_path, _engine_rules(runtime), [{"input_series": _fixture_series(runtime), "promql_expr_test": expr_tests}]
    )


def test_every_runtime_has_each_signal_or_says_why():
    for runtime, signals in engine_metrics.RUNTIMES.items():
        for signal in engine_metrics.SIGNALS:
            if signal in ("spec_decode_acceptance_rate", "spec_decode_acceptance_length"):
                continue  # the gauges stand in for counters an engine lacks
            assert signal in signals or (runtime, signal) in engine_metrics.MISSING, (runtime, signal)
        derived = {r["record"] for r in engine_metrics.recording_rules(runtime)}
        if (
            all(
                (runtime, s) in engine_metrics.MISSING
                for s in engine_metrics.SIGNALS
                if s.startswith("spec_decode")
                and s not in ("spec_decode_acceptance_rate", "spec_decode_acceptance_length")
            )
            and not {"spec_decode_acceptance_rate", "spec_decode_acceptance_length"} & signals.keys()
        ):
            continue  # an engine release with no speculative-decoding series at all (trtllm-serve 1.2.1)
        assert {
            f"{engine_metrics.PREFIX}spec_decode_acceptance_rate:rate5m",
            f"{engine_metrics.PREFIX}spec_decode_mean_acceptance_length:rate5m",
        } <= derived, runtime


def test_unknown_runtime_is_refused_with_the_known_ones():
    with pytest.raises(KeyError, match="available: .*vllm"):
        engine_metrics.recording_rules("tgi")


@pytest.mark.parametrize("runtime", sorted(engine_metrics.RUNTIMES))
def test_autoscaler_queries_read_each_runtimes_own_queue(tmp_path, runtime):
    """KEDA's two triggers (templates/scaledobject-worker.yaml) query the engine's own gauges, not a recording rule:
    against the runtime's recorded `/metrics`, waiting requests come out as 3 and busy slots as 6, as recorded."""
    entry = engine_metrics.table()[runtime]
    queries = {
        name: f"sum({fill_selectors(entry[name], RELEASE, NAMESPACE)})"
        for name in ("waiting", "running")
        if entry[name] is not None
    }
    expected = {"waiting": 3, "running": 6}
    _promtool_test(
        tmp_path,
        {"groups": []},
        [
            {
                "input_series": _fixture_series(runtime),
                "promql_expr_test": [
                    {"expr": query, "eval_time": "5m", "exp_samples": [{"labels": "{}", "value": expected[name]}]}
                    for name, query in queries.items()
                ],
            }
        ],
    )


def test_every_runtime_the_chart_accepts_has_a_metric_mapping():
    """worker.runtime's enum in values.schema.json names no runtime that engines.yaml lacks (the chart would fail
    to render its PrometheusRule, and an operator would see no engine panels)."""
    import json

    schema = json.loads((REPO / "helm" / "deepspec" / "values.schema.json").read_text())
    accepted = set(schema["properties"]["worker"]["properties"]["runtime"]["enum"])
    assert accepted <= set(engine_metrics.RUNTIMES), sorted(accepted - set(engine_metrics.RUNTIMES))


#: value sets that select each runtime (conftest.VALUE_SETS; the engine runtimes' once the chart runs them)
RUNTIME_VALUE_SETS = [name for name in ("gpu", "triton", "vllm", "sglang", "trtllm-serve") if name in VALUE_SETS]


@pytest.mark.parametrize("values", RUNTIME_VALUE_SETS)
def test_the_chart_renders_the_selected_runtimes_rules_and_triggers(values):
    """The PrometheusRule's `deepspec.engine` group and the ScaledObject's queries are engines.yaml's entry for
    `worker.runtime`, selectors filled in."""
    values_set = {**VALUE_SETS[values]}
    values_set["worker"] = {**values_set["worker"], "autoscaling": {"enabled": True}}
    runtime = values_set["worker"].get("runtime", "deepspec")
    from tests.helm.conftest import one, render

    docs = render(values_set)
    group = next(g for g in one(docs, "PrometheusRule")["spec"]["groups"] if g["name"] == "deepspec.engine")
    want = [
        {**r, "expr": fill_selectors(r["expr"], RELEASE, NAMESPACE)} for r in engine_metrics.recording_rules(runtime)
    ]
    assert [{"record": r["record"], "expr": r["expr"]} for r in group["rules"]] == want
    triggers = {t["name"]: t for t in one(docs, "ScaledObject")["spec"]["triggers"]}
    entry = engine_metrics.table()[runtime]
    if entry["waiting"] is None:
        assert "waiting-requests" not in triggers
    else:
        assert triggers["waiting-requests"]["metadata"]["query"] == (
            f"sum({fill_selectors(entry['waiting'], RELEASE, NAMESPACE)})"
        )
    assert triggers["batch-utilization"]["metadata"]["query"].startswith(
        f"sum({fill_selectors(entry['running'], RELEASE, NAMESPACE)})"
    )


def _fields_the_model_drops(board: dict) -> list[str]:
    """Paths of fields (or values) Grafana's dashboard model (grafana-foundation-sdk) does not keep when it reads
    `board`: a misspelt or unknown field, a value of the wrong type."""
    import json

    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    back = json.loads(json.dumps(Dashboard.from_json(board), cls=JSONEncoder))
    dropped = []

    def walk(ours, theirs, path):
        if isinstance(ours, dict):
            for key, value in ours.items():
                if not isinstance(theirs, dict) or key not in theirs:
                    dropped.append(f"{path}/{key}")
                else:
                    walk(value, theirs[key], f"{path}/{key}")
        elif isinstance(ours, list):
            if not isinstance(theirs, list) or len(theirs) != len(ours):
                dropped.append(path)
            else:
                for i, (a, b) in enumerate(zip(ours, theirs)):
                    walk(a, b, f"{path}[{i}]")
        elif ours != theirs:
            dropped.append(f"{path}: {ours!r} -> {theirs!r}")

    walk(board, back, "")
    return dropped


def test_every_dashboard_survives_grafanas_own_model():
    """Each committed dashboard reads back through the SDK's `Dashboard.from_json` unchanged; a panel with a
    misspelt field does not (the check can fail)."""
    boards = dashboards()
    assert set(boards) == {"deepspec-overview", "deepspec-spec-decode", "deepspec-workers", "deepspec-engine"}
    for name, board in boards.items():
        assert not _fields_the_model_drops(board), name
    broken = dashboards()["deepspec-engine"]
    broken["panels"][1]["fieldconfig"] = broken["panels"][1].pop("fieldConfig")
    assert _fields_the_model_drops(broken) == ["/panels[1]/fieldconfig"]


def test_acceptance_collapse_fires_from_the_engines_own_counters(tmp_path):
    """An engine whose drafts the gateway never sees (no per-request counts in its responses) still raises the
    collapse alert: 10 % of its draft tokens accepted, read through the `deepspec_engine:` recordings."""
    rules = _alert_rules_without_annotations()
    _promtool_test(
        tmp_path,
        rules,
        [
            {
                "input_series": [
                    {"series": f"deepspec:spec_decode_num_draft_tokens_total{{{WORKER}}}", "values": "0+700x40"},
                    {"series": f"deepspec:spec_decode_num_accepted_tokens_total{{{WORKER}}}", "values": "0+70x40"},
                    {"series": f"deepspec:spec_decode_num_drafts_total{{{WORKER}}}", "values": "0+100x40"},
                ],
                "alert_rule_test": [_firing("DeepSpecAcceptanceRateCollapse", "30m", {**MODEL, "severity": "warning"})],
            }
        ],
    )


#: each engine's own names for what the alerts read, written out here (not taken from engine_metrics) so the test
#: checks the table against the engines rather than against itself
ENGINE_NAMES = {
    "vllm": {
        "ttft": "vllm:time_to_first_token_seconds",
        "tpot": "vllm:request_time_per_output_token_seconds",
        "waiting": "vllm:num_requests_waiting",
        "drafted": "vllm:spec_decode_num_draft_tokens_total",
        "accepted": "vllm:spec_decode_num_accepted_tokens_total",
    },
    "sglang": {
        "ttft": "sglang:time_to_first_token_seconds",
        "tpot": "sglang:inter_token_latency_seconds",
        "waiting": "sglang:num_queue_reqs",
        "accept_rate": "sglang:spec_accept_rate",
    },
    # 1.2.1: no queue gauge and no speculative-decoding series (helm/tools/engine_series.py)
    "trtllm-serve": {"ttft": "trtllm_time_to_first_token_seconds", "tpot": "trtllm_time_per_output_token_seconds"},
}


@pytest.mark.parametrize("runtime", sorted(ENGINE_NAMES))
def test_alerts_fire_from_each_engines_own_names(tmp_path, runtime):
    """The chart's alerts, run on a runtime's recording rules and fed only that engine's own series (vLLM:
    vllm/v1/metrics/loggers.py, vllm/v1/spec_decode/metrics.py; SGLang: python/sglang/srt/metrics/collector.py;
    TensorRT-LLM: tensorrt_llm/metrics/collector.py), with the model in `model_name` as those engines label it:
    slow first tokens, slow decode, a collapsed acceptance and a growing queue each fire for the served model."""
    names = ENGINE_NAMES[runtime]
    where = f'job="{RELEASE}-worker", namespace="{NAMESPACE}", model_name="{ENGINE_MODEL}"'
    series = [
        *_tpot(where, names["tpot"], slow=True),
        *[
            {**b, "series": b["series"].replace("deepspec:time_to_first_token_seconds", names["ttft"])}
            for b in _ttft(where, slow=True)
        ],
    ]
    fired = ["DeepSpecHighTimeToFirstToken", "DeepSpecSlowDecode"]
    if "waiting" in names:
        series.append({"series": f"{names['waiting']}{{{where}}}", "values": "0+2x40"})
        fired.append("DeepSpecQueueGrowing")
    if "accept_rate" in names:
        series.append({"series": f"{names['accept_rate']}{{{where}}}", "values": "0.1x40"})
        fired.append("DeepSpecAcceptanceRateCollapse")
    elif "drafted" in names:
        series += [
            {"series": f"{names['drafted']}{{{where}}}", "values": "0+700x40"},
            {"series": f"{names['accepted']}{{{where}}}", "values": "0+70x40"},
        ]
        fired.append("DeepSpecAcceptanceRateCollapse")
    alerts = [g for g in _alert_rules_without_annotations()["groups"] if g["name"] != "deepspec.engine"]
    rules = {"groups": _engine_rules(runtime)["groups"] + alerts}
    model = {"model": ENGINE_MODEL, "severity": "warning"}
    _promtool_test(
        tmp_path,
        rules,
        [{"input_series": series, "alert_rule_test": [_firing(alert, "30m", model) for alert in fired]}],
    )
