"""The chart as production runs it: worker autoscaling on queue depth, upgrades that keep capacity, drains that
agree, metrics off the public port, the model cache, GPU pinning and multi-GPU Triton — asserted on the rendered
objects of the default values and the two production profiles."""

from __future__ import annotations

import pytest
from helm_python.errors import HelmError

from tests.helm.conftest import (
    NAMESPACE,
    PROFILES,
    RELEASE,
    VALUE_SETS,
    container,
    find,
    one,
    render,
    render_files,
    workload,
)

GATEWAY_JOB = f"{RELEASE}-gateway"


def _pod(docs, component: str) -> dict:
    return workload(docs, component)["spec"]["template"]


def _mebibytes(quantity: str) -> int:
    for suffix, factor in (("Ti", 1024 * 1024), ("Gi", 1024), ("Mi", 1)):
        if quantity.endswith(suffix):
            return int(quantity[: -len(suffix)]) * factor
    raise ValueError(quantity)


# --- Upgrades without an outage ------------------------------------------------------------------------------


def test_worker_rollouts_surge_and_wait_out_the_startup_budget():
    docs = render()
    deployment = workload(docs, "worker")
    spec = deployment["spec"]
    assert spec["replicas"] == 2  # one pod can always go while the other serves
    assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    startup = container(spec["template"]["spec"], "worker")["startupProbe"]
    budget = startup["periodSeconds"] * startup["failureThreshold"]
    assert budget >= 1800
    assert spec["progressDeadlineSeconds"] >= budget  # a slow but healthy model load never fails the rollout
    spec = workload(render({"worker": {"startupBudgetSeconds": 3600}}), "worker")["spec"]
    assert spec["progressDeadlineSeconds"] >= 3600
    assert (
        workload(render({"worker": {"rollout": {"progressDeadlineSeconds": 4000}}}), "worker")["spec"][
            "progressDeadlineSeconds"
        ]
        == 4000
    )
    with pytest.raises(HelmError, match="progressDeadlineSeconds .* shorter than worker.startupBudgetSeconds"):
        render_files({"worker": {"rollout": {"progressDeadlineSeconds": 600}}})


def test_worker_pdb_is_on_and_lets_unhealthy_pods_go():
    pdb = one(render(), "PodDisruptionBudget", "worker")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert not find(render({"worker": {"pdb": {"enabled": False}}}), "PodDisruptionBudget", "worker")


@pytest.mark.parametrize("name", PROFILES)
def test_workers_spread_over_nodes_and_zones(name):
    docs = render(VALUE_SETS[name])
    template = _pod(docs, "worker")
    constraints = template["spec"]["topologySpreadConstraints"]
    assert {c["topologyKey"] for c in constraints} == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    revision = "controller-revision-hash" if workload(docs, "worker")["kind"] == "StatefulSet" else "pod-template-hash"
    for c in constraints:
        assert c["whenUnsatisfiable"] == "ScheduleAnyway" and c["maxSkew"] == 1
        assert all(template["metadata"]["labels"][k] == v for k, v in c["labelSelector"]["matchLabels"].items())
        assert c["matchLabelKeys"] == [revision]
    custom = [
        {
            "maxSkew": 2,
            "topologyKey": "rack",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "x"}},
        }
    ]
    assert (
        _pod(render({"worker": {"topologySpreadConstraints": custom}}), "worker")["spec"]["topologySpreadConstraints"]
        == custom
    )


@pytest.mark.parametrize("name", PROFILES)
def test_worker_memory_is_guaranteed(name):
    """Memory requests equal limits in every worker container: never the first pod evicted under memory pressure."""
    spec = _pod(render(VALUE_SETS[name]), "worker")["spec"]
    for c in spec["containers"] + spec.get("initContainers", []):
        assert c["resources"]["requests"]["memory"] == c["resources"]["limits"]["memory"], c["name"]


# --- Drains that agree ----------------------------------------------------------------------------------------


def _flag(c: dict, name: str) -> str:
    """The value of `--name=value` in a container's args (the same for every mpirun rank)."""
    [value] = {a.split("=", 1)[1] for a in c["args"] if a.startswith(f"{name}=")}
    return value


@pytest.mark.parametrize("name", PROFILES)
def test_drains_agree_and_grace_periods_cover_them(name):
    docs = render(VALUE_SETS[name])
    gw_spec, wk_spec = _pod(docs, "gateway")["spec"], _pod(docs, "worker")["spec"]
    gw, wk = container(gw_spec, "gateway"), container(wk_spec, "worker")
    gw_drain, timeout = float(_flag(gw, "--drain-timeout-s")), float(_flag(gw, "--request-timeout-s"))
    gw_sleep = int(gw["lifecycle"]["preStop"]["exec"]["command"][1])
    wk_sleep = int(wk["lifecycle"]["preStop"]["exec"]["command"][1])
    assert gw["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep" and gw_sleep >= 5
    assert wk["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep" and wk_sleep >= 5
    # preStop runs inside the grace period, then SIGTERM starts the drain: both must fit before SIGKILL.
    assert gw_spec["terminationGracePeriodSeconds"] >= gw_sleep + gw_drain + 10
    # Triton drains on SIGTERM for --exit-timeout-secs; our worker for --drain-timeout-s.
    triton = wk["command"] != ["python", "-m", "service", "worker"]
    wk_drain = float(_flag(wk, "--exit-timeout-secs" if triton else "--drain-timeout-s"))
    assert wk_spec["terminationGracePeriodSeconds"] >= wk_sleep + wk_drain + 10
    assert gw_drain >= wk_drain >= timeout  # a worker's last stream still has its gateway; no request outlives a drain
    assert "--ready-without-workers" in gw["args"]  # no worker: 503 + Retry-After from every gateway, not no gateway


def test_a_gateway_drain_shorter_than_the_worker_drain_is_refused():
    with pytest.raises(
        HelmError, match="gateway.drainTimeoutSeconds \\(60\\) must be at least worker.drainTimeoutSeconds"
    ):
        render_files({"gateway": {"drainTimeoutSeconds": 60}})
    args = container(_pod(render({"gateway": {"readyWithoutWorkers": False}}), "gateway")["spec"], "gateway")["args"]
    assert "--ready-without-workers" not in args


# --- Worker autoscaling ------------------------------------------------------------------------------------------


def test_worker_autoscaling_scales_on_queue_depth_and_batch_use():
    docs = render(
        {"worker": {"autoscaling": {"enabled": True, "targetWaitingPerWorker": 3}}, "model": {"maxBatchSize": 32}}
    )
    scaled = one(docs, "ScaledObject")
    deployment = workload(docs, "worker")
    assert "replicas" not in deployment["spec"]  # KEDA's HPA owns the count; a re-apply must not reset it
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (2, 8)
    assert (
        spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 600
    )
    waiting, busy = spec["triggers"]
    selector = f'job="{RELEASE}-worker", namespace="{NAMESPACE}"'
    assert waiting["metadata"]["query"] == f"sum(deepspec:num_requests_waiting{{{selector}}})"
    assert waiting["metadata"]["threshold"] == "3" and waiting["metricType"] == "AverageValue"
    assert busy["metadata"]["query"] == f"sum(deepspec:num_requests_running{{{selector}}}) / 32"
    assert busy["metadata"]["threshold"] == "0.8"
    for trigger in spec["triggers"]:
        assert trigger["type"] == "prometheus" and trigger["metadata"]["serverAddress"].startswith("http")
    # Off (the default): no ScaledObject, a fixed replica count.
    docs = render()
    assert not find(docs, "ScaledObject") and workload(docs, "worker")["spec"]["replicas"] == 2
    with pytest.raises(HelmError, match="worker.autoscaling.minReplicas"):
        render_files({"worker": {"autoscaling": {"enabled": True, "minReplicas": 9, "maxReplicas": 3}}})


def test_triton_workers_scale_on_the_exported_models_own_gauges():
    """The LLM-API model's queue gauges (export/triton/llmapi_model.py RequestGauges); tests/helm/test_engine_series.py
    checks every series against what the pinned Triton emits."""
    spec = one(render(VALUE_SETS["prod-triton-pvc"]), "ScaledObject")["spec"]
    waiting, busy = (t["metadata"]["query"] for t in spec["triggers"])
    assert waiting.startswith("sum(deepspec_llmapi_num_requests_waiting{")
    assert busy.startswith("sum(deepspec_llmapi_num_requests_running{")
    sts = render(VALUE_SETS["prod-export-sts"])
    assert one(sts, "ScaledObject")["spec"]["scaleTargetRef"]["kind"] == "StatefulSet"
    assert "replicas" not in workload(sts, "worker")["spec"]


# --- Exposure ------------------------------------------------------------------------------------------------------


def test_gateway_metrics_have_their_own_port_outside_the_ingress():
    docs = render(VALUE_SETS["prod-triton-pvc"])
    gw = container(_pod(docs, "gateway")["spec"], "gateway")
    assert _flag(gw, "--metrics-port") == "8002"
    ingress = one(docs, "Ingress")
    for rule in ingress["spec"]["rules"]:
        for path in rule["http"]["paths"]:
            assert path["backend"]["service"] == {"name": GATEWAY_JOB, "port": {"name": "http"}}
    assert "metrics" not in {p["name"] for p in one(docs, "Service", "gateway")["spec"]["ports"]}
    metrics_svc = one(docs, "Service", "gateway-metrics")
    assert metrics_svc["spec"]["clusterIP"] == "None"
    assert [p["targetPort"] for p in metrics_svc["spec"]["ports"]] == ["metrics"]
    sm = one(docs, "ServiceMonitor", "gateway")
    [endpoint] = sm["spec"]["endpoints"]
    assert endpoint["port"] == "metrics"
    assert {"action": "replace", "targetLabel": "job", "replacement": GATEWAY_JOB} in endpoint["relabelings"]


@pytest.mark.parametrize("name, annotated", [("default", True), ("gpu", False), ("monitoring-off", False)])
def test_one_scrape_path(name, annotated):
    """Pod annotations only where no ServiceMonitor scrapes: otherwise every series would be collected twice."""
    docs = render(VALUE_SETS[name])
    for component in ("gateway", "worker"):
        annotations = _pod(docs, component)["metadata"].get("annotations", {})
        assert ("prometheus.io/scrape" in annotations) == annotated, component
        if annotated:
            assert annotations["prometheus.io/port"] == "8002"  # the metrics port, never the API port
    assert bool(find(docs, "ServiceMonitor")) == (name == "gpu")


def test_gateway_network_policy_keeps_metrics_to_the_scrapers():
    docs = render()
    policy = one(docs, "NetworkPolicy", "gateway")
    labels = _pod(docs, "gateway")["metadata"]["labels"]
    assert all(labels[k] == v for k, v in policy["spec"]["podSelector"]["matchLabels"].items())
    api, metrics = policy["spec"]["ingress"]
    assert {p["port"] for p in api["ports"]} == {"http", "grpc"} and "from" not in api
    assert metrics["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert metrics["from"] == [{"namespaceSelector": {}}]
    peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}]
    api, _ = one(render({"networkPolicy": {"apiFrom": peers}}), "NetworkPolicy", "gateway")["spec"]["ingress"]
    assert api["from"] == peers
    # The helm test pod only calls out: a policy with no ingress rule lets nothing in.
    test_policy = one(docs, "NetworkPolicy", "test")
    pod_labels = one(docs, "Pod")["metadata"]["labels"]
    assert all(pod_labels[k] == v for k, v in test_policy["spec"]["podSelector"]["matchLabels"].items())
    assert test_policy["spec"]["policyTypes"] == ["Ingress"] and "ingress" not in test_policy["spec"]
    assert not find(render({"networkPolicy": {"enabled": False}}), "NetworkPolicy")


# --- Volumes ---------------------------------------------------------------------------------------------------


def test_model_cache_pvc_is_shared_and_kept():
    docs = render(VALUE_SETS["prod-triton-pvc"])
    claim = one(docs, "PersistentVolumeClaim", "model-cache")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "200Gi"
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    spec = _pod(docs, "worker")["spec"]
    cache = next(v for v in spec["volumes"] if v["name"] == "cache")
    assert cache == {"name": "cache", "persistentVolumeClaim": {"claimName": claim["metadata"]["name"]}}
    assert {"name": "cache", "mountPath": "/cache"} in container(spec, "worker")["volumeMounts"]
    docs = render({"worker": {"modelCache": {"type": "pvc", "pvc": {"existingClaim": "hf-cache"}}}})
    assert not find(docs, "PersistentVolumeClaim")
    cache = next(v for v in _pod(docs, "worker")["spec"]["volumes"] if v["name"] == "cache")
    assert cache["persistentVolumeClaim"]["claimName"] == "hf-cache"
    assert not find(render(), "PersistentVolumeClaim")  # emptyDir by default
    with pytest.raises(HelmError, match="perReplicaVolume"):
        render_files({"worker": {"modelCache": {"type": "pvc"}, "perReplicaVolume": {"enabled": True}}})


@pytest.mark.parametrize("name", [*PROFILES, "cpu-export-onnx"])
def test_ephemeral_storage_requests_cover_the_emptydirs(name):
    docs = render(VALUE_SETS[name])
    for component in ("gateway", "worker"):
        spec = _pod(docs, component)["spec"]
        disk = sum(
            _mebibytes(v["emptyDir"]["sizeLimit"])
            for v in spec["volumes"]
            if "emptyDir" in v and v["emptyDir"].get("medium") != "Memory"
        )
        for c in spec["containers"] + spec.get("initContainers", []):
            assert _mebibytes(c["resources"]["requests"]["ephemeral-storage"]) >= disk, (component, c["name"])


def test_sizes_in_other_units_fail_with_the_unit_to_use():
    with pytest.raises(HelmError, match='size "500G": write it in Mi, Gi or Ti'):
        render_files({"worker": {"modelCache": {"size": "500G"}}})
    request = container(_pod(render({"worker": {"modelCache": {"size": "1Ti"}}}), "worker")["spec"], "worker")
    assert request["resources"]["requests"]["ephemeral-storage"] == f"{1024 + 1024 * 1024}Mi"  # /tmp + the cache


def test_extra_env_reaches_the_export_init_container():
    spec = _pod(render(VALUE_SETS["prod-export-sts"]), "worker")["spec"]
    for name in ("worker", "export-bundle"):
        env = {e["name"]: e for e in container(spec, name)["env"]}
        assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}, name


# --- GPUs ------------------------------------------------------------------------------------------------------


def test_prebuilt_engines_pin_their_gpu_architecture():
    spec = _pod(render(VALUE_SETS["prod-triton-pvc"]), "worker")["spec"]
    [term] = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term == {"matchExpressions": [{"key": "nvidia.com/gpu.family", "operator": "In", "values": ["hopper"]}]}
    spec = _pod(
        render(
            {
                "worker": {
                    "gpu": {"architectures": ["NVIDIA-H100-80GB-HBM3"], "architectureLabel": "nvidia.com/gpu.product"}
                }
            }
        ),
        "worker",
    )["spec"]
    [term] = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["key"] == "nvidia.com/gpu.product"
    assert "affinity" not in _pod(render(), "worker")["spec"]
    with pytest.raises(HelmError, match="needs worker.device=cuda"):
        render_files({"worker": {"device": "cpu", "gpu": {"architectures": ["ampere"]}}})
    with pytest.raises(HelmError, match="drop worker.affinity.nodeAffinity"):
        render_files(
            {
                "worker": {
                    "gpu": {"architectures": ["ampere"]},
                    "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
                }
            }
        )


def test_multi_gpu_triton_gets_one_gpu_per_rank():
    """Each rank's launch line is tests/helm/test_triton_launch.py's; here, the GPUs it is given and the refusal."""
    worker = container(_pod(render(VALUE_SETS["prod-triton-pvc"]), "worker")["spec"], "worker")
    assert worker["command"][:2] == ["sh", "-c"] and "mpirun" in worker["command"][2]
    assert " ".join(worker["args"]).count(" : ") == 1
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 2
    single = container(_pod(render(VALUE_SETS["triton-pvc"]), "worker")["spec"], "worker")
    assert single["command"] == ["tritonserver"] and ":" not in single["args"]
    with pytest.raises(HelmError, match="raise worker.gpu.count \\(1\\) to 4"):
        render_files(
            {
                "worker": {
                    "runtime": "triton",
                    "bundles": {"source": "pvc"},
                    "triton": {"tensorParallel": 2, "pipelineParallel": 2},
                }
            }
        )
