"""Every series the chart queries for a `worker.runtime` is one that runtime's pinned engine release emits
(helm/tools/engine_series.py), ours (service/metrics.py), recorded by our rules, or a cluster exporter's: the chart is
rendered for each runtime and every KEDA trigger, alert and recording-rule expression is read back."""

from __future__ import annotations

import sys

import pytest

from service.metrics import ALL_METRIC_NAMES
from tests.docker import load_script
from tests.helm.conftest import REPO, VALUE_SETS, one, render
from tests.helm.promql import EXTERNAL_METRICS, base_name, engine_metrics, metric_names

engine_series = load_script("engine_series", REPO / "helm" / "tools" / "engine_series.py")
images = sys.modules.get("deepspec_images") or load_script("deepspec_images", REPO / "docker" / "images.py")

#: worker.runtime -> a value set that selects it (tests/helm/conftest.py)
RUNTIME_VALUES = {"triton": "triton", "trtllm-serve": "trtllm-serve", "vllm": "vllm", "sglang": "sglang"}


def pinned_version(runtime: str) -> str:
    """The engine release the chart runs for `runtime`: docker/images.py's pins."""
    return images.pinned().triton if runtime == "triton" else images.engine_image(runtime).version


def _queries(runtime: str) -> list[tuple[str, str]]:
    values = {**VALUE_SETS[RUNTIME_VALUES[runtime]]}
    values["worker"] = {**values["worker"], "autoscaling": {"enabled": True}}
    docs = render(values)
    out = [(f"ScaledObject/{t['name']}", t["metadata"]["query"]) for t in one(docs, "ScaledObject")["spec"]["triggers"]]
    for group in one(docs, "PrometheusRule")["spec"]["groups"]:
        for rule in group["rules"]:
            out.append((f"PrometheusRule/{group['name']}/{rule.get('record') or rule.get('alert')}", rule["expr"]))
    return out


def unknown_series(runtime: str, queries: list[tuple[str, str]]) -> list[str]:
    """`where: name` for each series a query names that neither the runtime's pinned release, DeepSpec, our rules
    nor a cluster exporter emits."""
    version, bad = pinned_version(runtime), []
    recorded = engine_metrics.recorded_names()
    for where, expr in queries:
        for name in metric_names(expr):
            if name.startswith("deepspec:"):
                ok = base_name(name) in ALL_METRIC_NAMES
            elif name.startswith(engine_metrics.PREFIX):
                ok = base_name(name) in {base_name(r) for r in recorded}
            else:
                ok = name in EXTERNAL_METRICS or engine_series.emits(runtime, version, name)
            if not ok:
                bad.append(f"{where}: {name}")
    return bad


def test_the_series_lists_are_those_of_the_pinned_releases():
    for runtime in RUNTIME_VALUES:
        assert pinned_version(runtime) in engine_series.EMITTED[runtime], runtime


@pytest.mark.parametrize("runtime", sorted(RUNTIME_VALUES))
def test_every_query_the_chart_renders_names_a_series_the_pinned_engine_emits(runtime):
    queries = _queries(runtime)
    assert any(w.startswith("ScaledObject/") for w, _ in queries) and any("deepspec.engine" in w for w, _ in queries)
    assert unknown_series(runtime, queries) == []


@pytest.mark.parametrize("runtime", sorted(RUNTIME_VALUES))
def test_every_engine_source_of_the_runtime_is_emitted_by_its_pinned_release(runtime):
    """The table the rules and triggers come from (helm/tools/engine_metrics.py RUNTIMES), source by source."""
    for signal, source in engine_metrics.RUNTIMES[runtime].items():
        if source.job == "gateway":
            assert base_name(source.metric) in ALL_METRIC_NAMES, signal
        else:
            assert engine_series.emits(runtime, pinned_version(runtime), source.metric), (signal, source.metric)


def test_a_series_only_a_later_release_or_another_backend_emits_is_reported():
    """Negative control: trtllm-serve's post-1.2 queue gauge, and the C++ backend's series on the Python-backend
    Triton model, are what the chart used to query; the check names both."""
    bad = unknown_series("trtllm-serve", [("old", 'sum(trtllm_num_requests_waiting{job="w"})')])
    assert bad == ["old: trtllm_num_requests_waiting"]
    bad = unknown_series("triton", [("old", 'sum(nv_trt_llm_request_metrics{request_type="active"})')])
    assert bad == ["old: nv_trt_llm_request_metrics"]
    assert engine_series.emits("trtllm-serve", "1.2.1", "trtllm_time_to_first_token_seconds_bucket")
    with pytest.raises(KeyError, match="no series list for trtllm-serve 9.9"):
        engine_series.emits("trtllm-serve", "9.9", "x")
