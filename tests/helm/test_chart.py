"""helm/deepspec renders, lints and validates for every supported deployment, with the security, probes,
resources and selectors that matter asserted on the rendered objects."""

from __future__ import annotations

import base64
import functools
import json

import kubernetes_validate
import pytest
from helm_python import lint
from helm_python.errors import HelmError

from tests.helm.conftest import (
    CHART_DIR,
    NAMESPACE,
    RELEASE,
    VALUE_SETS,
    container,
    find,
    manifests,
    one,
    pod_specs,
    render,
    render_files,
    workload,
)

# kubernetes-validate re-reads and re-parses a schema file (and each one it $refs) for every object: ~4 s per value set
# and version. The files never change, so parse each once.
kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(kubernetes_validate.utils.schema_contents)

KUBE_VERSIONS = ("1.30.0", "1.33.0")  # oldest still-supported minor we target, and a current one
CUSTOM_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ScaledObject"}  # CRDs: test_crds.py
WORKER_SVC = f"{RELEASE}-worker"
GATEWAY_SVC = f"{RELEASE}-gateway"


def matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# --- Lint and schema validation ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", VALUE_SETS)
def test_lint_is_clean(name):
    report = lint(CHART_DIR, VALUE_SETS[name], strict=True, namespace=NAMESPACE, kube_version="v1.30.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, report


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_manifest_validates_against_kubernetes_schema(name, kube_version):
    docs = manifests(render(VALUE_SETS[name]))
    assert docs
    for doc in docs:
        if doc["kind"] in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, kube_version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{doc['kind']} {doc['metadata']['name']}: {e.message} at {list(e.path)}")


@pytest.mark.parametrize(
    "bad, where",
    [
        ({"worker": {"replicaCount": "two"}}, "/worker/replicaCount"),
        ({"worker": {"device": "tpu"}}, "/worker/device"),
        ({"worker": {"runtime": "tgi"}}, "/worker/runtime"),
        ({"gateway": {"httpPort": 70000}}, "/gateway/httpPort"),
        ({"gateway": {"discovery": "consul"}}, "/gateway/discovery"),
        ({"worker": {"startupBudgetSeconds": -5}}, "/worker/startupBudgetSeconds"),
        ({"apiKeys": {"keys": "sk-1,sk-2"}}, "/apiKeys/keys"),
        ({"ingress": {"enabled": "yes"}}, "/ingress/enabled"),
        ({"monitoring": {"prometheusRule": {"errorRatio": "high"}}}, "/monitoring/prometheusRule/errorRatio"),
        ({"worker": {"bundles": {"source": "s3"}}}, "/worker/bundles/source"),
        ({"worker": {"engines": {"source": "s3"}}}, "/worker/engines"),  # the deprecated name is checked too
        ({"worker": {"gpus": 2}}, "/worker"),  # a typo of worker.gpu is an unknown key, not a silent no-op
        ({"replicas": 3}, "additional properties"),
    ],
)
def test_schema_rejects_wrong_values(bad, where):
    with pytest.raises(HelmError, match="schema") as info:
        render_files(bad)
    assert where in str(info.value)


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"worker": {"runtime": "triton"}}, "worker.bundles.source"),
        ({"worker": {"runtime": "triton", "device": "cpu", "bundles": {"source": "image"}}}, "worker.device=cuda"),
        ({"worker": {"bundles": {"source": "pvc"}, "perReplicaVolume": {"enabled": True}}}, "perReplicaVolume"),
        ({"gateway": {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}}, "minReplicas"),
        ({"serviceAccount": {"create": False}}, "serviceAccount.name"),
    ],
)
def test_impossible_combinations_fail_with_the_setting_to_change(bad, message):
    with pytest.raises(HelmError) as info:
        render_files(bad)
    assert message in str(info.value)


# --- Security, resources, selectors: every value set -------------------------------------------------------


@pytest.mark.parametrize("name", VALUE_SETS)
def test_pods_are_locked_down(name):
    for pod_name, spec in pod_specs(render(VALUE_SETS[name])):
        ctx = spec["securityContext"]
        assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] > 0, pod_name
        assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}, pod_name
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c["securityContext"]
            where = f"{pod_name}/{c['name']}"
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"], where
            assert not sc.get("privileged"), where
            assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"], where
            assert c["resources"]["limits"]["memory"], where
            image = c["image"]
            assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), where
        # A read-only root needs writable scratch space; every such mount is backed by a volume of the pod.
        volumes = {v["name"] for v in spec.get("volumes", [])}
        for c in spec["containers"] + spec.get("initContainers", []):
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes or m["name"] in _claim_templates(render(VALUE_SETS[name])), m


def _claim_templates(docs):
    return {
        t["metadata"]["name"] for d in docs if d["kind"] == "StatefulSet" for t in d["spec"]["volumeClaimTemplates"]
    }


@pytest.mark.parametrize("name", VALUE_SETS)
def test_selectors_wire_up(name):
    docs = render(VALUE_SETS[name])
    pods = {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d["spec"]["template"]["metadata"]["labels"]
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet")
    }
    assert set(pods) == {"gateway", "worker"}
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet"):
            assert matches(d["spec"]["selector"]["matchLabels"], d["spec"]["template"]["metadata"]["labels"])
    gateway_svc, worker_svc = one(docs, "Service", "gateway"), one(docs, "Service", "worker")
    assert matches(gateway_svc["spec"]["selector"], pods["gateway"])
    assert not matches(gateway_svc["spec"]["selector"], pods["worker"])
    assert matches(worker_svc["spec"]["selector"], pods["worker"])
    assert worker_svc["spec"]["clusterIP"] == "None"  # headless: the gateway balances per pod
    # Service target ports name container ports.
    for svc, component in ((gateway_svc, "gateway"), (worker_svc, "worker")):
        spec = workload(docs, component)["spec"]["template"]["spec"]
        port_names = {p["name"] for p in spec["containers"][0]["ports"]}
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= port_names
    for pdb in find(docs, "PodDisruptionBudget"):
        component = pdb["metadata"]["labels"]["app.kubernetes.io/component"]
        assert matches(pdb["spec"]["selector"]["matchLabels"], pods[component])
    for hpa in find(docs, "HorizontalPodAutoscaler"):
        assert hpa["spec"]["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": workload(docs, "gateway")["metadata"]["name"],
        }
    for sm in find(docs, "ServiceMonitor"):
        component = sm["metadata"]["labels"]["app.kubernetes.io/component"]
        [svc] = [
            s for s in find(docs, "Service") if matches(sm["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
        ]
        assert matches(svc["spec"]["selector"], pods[component])  # the Service reaches that component's pods
        assert {e["port"] for e in sm["spec"]["endpoints"]} <= {p["name"] for p in svc["spec"]["ports"]}


@pytest.mark.parametrize("name", VALUE_SETS)
def test_configmap_and_secret_references_exist(name):
    docs = render(VALUE_SETS[name])
    configmaps = {d["metadata"]["name"] for d in find(docs, "ConfigMap")}
    secrets = {d["metadata"]["name"]: d for d in find(docs, "Secret")}
    values = VALUE_SETS[name]
    external = {values.get("apiKeys", {}).get("existingSecret")} | {  # Secrets the operator creates
        e["valueFrom"]["secretKeyRef"]["name"]
        for e in values.get("worker", {}).get("extraEnv", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    for pod_name, spec in pod_specs(docs):
        for c in spec["containers"] + spec.get("initContainers", []):
            for src in c.get("envFrom", []):
                assert src["configMapRef"]["name"] in configmaps
            for env in c.get("env", []):
                ref = env.get("valueFrom", {})
                if "configMapKeyRef" in ref:
                    assert ref["configMapKeyRef"]["name"] in configmaps
                if "secretKeyRef" in ref:
                    key_ref = ref["secretKeyRef"]
                    if key_ref["name"] not in external:
                        assert key_ref["key"] in secrets[key_ref["name"]]["data"], (pod_name, key_ref)
        for volume in spec.get("volumes", []):  # mounted Secrets (the API-key file)
            if "secret" in volume and volume["secret"]["secretName"] not in external:
                data = secrets[volume["secret"]["secretName"]]["data"]
                assert all(item["key"] in data for item in volume["secret"].get("items", [])), (pod_name, volume)


# --- Gateway ------------------------------------------------------------------------------------------------


def test_gateway_finds_workers_through_the_headless_service():
    docs = render()
    spec = workload(docs, "gateway")["spec"]["template"]["spec"]
    gw = container(spec, "gateway")
    assert gw["command"] == ["python", "-m", "service", "gateway"]
    assert f"--workers=dns://{WORKER_SVC}.{NAMESPACE}.svc.cluster.local:8001" in gw["args"]
    assert {"--http-port=8000", "--grpc-port=50051", "--metrics-port=8002", "--drain-timeout-s=300"} <= set(gw["args"])
    assert {(p["name"], p["containerPort"]) for p in gw["ports"]} == {
        ("http", 8000),
        ("grpc", 50051),
        ("metrics", 8002),
    }
    assert gw["readinessProbe"]["httpGet"] == {"path": "/health/ready", "port": "http"}
    assert gw["livenessProbe"]["httpGet"] == {"path": "/health/live", "port": "http"}
    assert spec["automountServiceAccountToken"] is False
    # The API Service (and so the Ingress and a LoadBalancer) carries no metrics port.
    svc = one(docs, "Service", "gateway")
    assert {(p["name"], p["port"]) for p in svc["spec"]["ports"]} == {("http", 8000), ("grpc", 50051)}
    assert not find(docs, "Role") and not find(docs, "Ingress")


def test_endpointslices_discovery_gets_a_role_to_watch_them():
    docs = render(VALUE_SETS["endpointslices"])
    role = one(docs, "Role")
    assert role["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]}
    ]
    binding = one(docs, "RoleBinding")
    sa = one(docs, "ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}]
    spec = workload(docs, "gateway")["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == sa["metadata"]["name"] and spec["automountServiceAccountToken"] is True
    args = container(spec, "gateway")["args"]
    assert "--discovery=endpointslices" in args and f"--workers=k8s://{WORKER_SVC}.{NAMESPACE}:grpc" in args


def test_hpa_scales_on_cpu_and_optionally_on_a_prometheus_adapter_metric():
    hpa = one(render(), "HorizontalPodAutoscaler")
    assert [m["type"] for m in hpa["spec"]["metrics"]] == ["Resource"]
    assert "replicas" not in workload(render(), "gateway")["spec"]  # the HPA owns the replica count
    hpa = one(render(VALUE_SETS["endpointslices"]), "HorizontalPodAutoscaler")
    pods_metric = hpa["spec"]["metrics"][1]["pods"]
    assert pods_metric["metric"]["name"] == "deepspec_gateway_num_requests_outstanding"
    assert ":" not in pods_metric["metric"]["name"]
    docs = render(VALUE_SETS["no-auth-no-hpa"])
    assert not find(docs, "HorizontalPodAutoscaler") and workload(docs, "gateway")["spec"]["replicas"] == 2


def test_gateway_pdb_never_blocks_node_drains():
    assert one(render(), "PodDisruptionBudget", "gateway")["spec"]["minAvailable"] == 1
    single = {"gateway": {"replicaCount": 1, "autoscaling": {"enabled": False}}}
    assert not find(render(single), "PodDisruptionBudget", "gateway")
    assert not find(render({"gateway": {"autoscaling": {"minReplicas": 1}}}), "PodDisruptionBudget", "gateway")


def _api_keys_mount(docs) -> tuple[dict, str]:
    """(the gateway's API-key volume, its --api-keys-file path) — keys are a mounted file, never an env var."""
    spec = workload(docs, "gateway")["spec"]["template"]["spec"]
    gw = container(spec, "gateway")
    assert all(e["name"] != "DEEPSPEC_API_KEYS" for e in gw["env"])
    [path] = [a.split("=", 1)[1] for a in gw["args"] if a.startswith("--api-keys-file=")]
    [mount] = [m for m in gw["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    assert mount["readOnly"] is True
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    return volume["secret"], path


def test_api_keys_are_a_mounted_file_from_a_secret_that_survives_upgrades():
    docs = render({"apiKeys": {"keys": ["sk-a", "sk-b"]}})
    secret = one(docs, "Secret")
    assert base64.b64decode(secret["data"]["api-keys"]).decode() == "sk-a,sk-b"
    volume, path = _api_keys_mount(docs)
    assert volume["secretName"] == secret["metadata"]["name"]
    assert volume["items"] == [{"key": "api-keys", "path": "api-keys"}] and path.endswith("/api-keys")
    # Given keys render the same Secret every time (GitOps diffs stay empty).
    assert render({"apiKeys": {"keys": ["sk-a", "sk-b"]}}) == docs
    generated = base64.b64decode(one(render(), "Secret")["data"]["api-keys"]).decode()
    assert generated.startswith("sk-deepspec-") and len(generated) > 30
    assert "lookup" in (CHART_DIR / "templates" / "secret-api-keys.yaml").read_text()  # kept on upgrade


def test_offline_renders_must_name_their_keys():
    """`helm template` and Argo CD cannot read a generated key back: with generate=false a missing key fails."""
    with pytest.raises(HelmError, match="apiKeys.keys' or 'apiKeys.existingSecret' must be defined"):
        render_files({"apiKeys": {"generate": False}})
    docs = render({"apiKeys": {"generate": False, "keys": ["sk-1"]}})
    assert base64.b64decode(one(docs, "Secret")["data"]["api-keys"]).decode() == "sk-1"


def test_existing_secret_is_referenced_not_created():
    docs = render(VALUE_SETS["existing-secret"])
    assert not find(docs, "Secret")
    volume, path = _api_keys_mount(docs)
    assert volume["secretName"] == "my-keys" and volume["items"] == [{"key": "keys", "path": "keys"}]
    assert path.endswith("/keys")
    docs = render(VALUE_SETS["no-auth-no-hpa"])
    assert not find(docs, "Secret")
    gw = container(workload(docs, "gateway")["spec"]["template"]["spec"], "gateway")
    assert not any(a.startswith("--api-keys-file") for a in gw["args"])


def test_ingress_routes_to_the_gateway_http_port():
    ingress = one(render(VALUE_SETS["ingress"]), "Ingress")
    assert ingress["spec"]["ingressClassName"] == "nginx"
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": GATEWAY_SVC, "port": {"name": "http"}}
    assert ingress["spec"]["tls"] == [{"hosts": ["deepspec.example.com"], "secretName": "deepspec-tls"}]


def test_helm_test_pod_sends_one_completion():
    pod = one(render(), "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    c = pod["spec"]["containers"][0]
    env = {e["name"]: e for e in c["env"]}
    assert env["DEEPSPEC_URL"]["value"] == f"http://{GATEWAY_SVC}.{NAMESPACE}.svc.cluster.local:8000"
    # The key as a mounted file, like the gateway's.
    keys_file = env["DEEPSPEC_API_KEYS_FILE"]["value"]
    [mount] = [m for m in c["volumeMounts"] if keys_file.startswith(m["mountPath"] + "/")]
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == one(render(), "Secret")["metadata"]["name"]
    assert all("valueFrom" not in e for e in c["env"])
    script = c["args"][0]
    compile(script, "helm-test", "exec")  # the inline script is valid Python
    assert "/v1/models" in script and "/v1/completions" in script and "Authorization" in script
    assert pod["spec"]["restartPolicy"] == "Never"


# --- Workers ------------------------------------------------------------------------------------------------


def _worker(values):
    docs = render(values)
    spec = workload(docs, "worker")["spec"]["template"]["spec"]
    config = one(docs, "ConfigMap", "model")["data"]
    return docs, spec, container(spec, "worker"), config


def test_gpu_worker_requests_gpus_tolerates_their_taint_and_gets_shm():
    docs, spec, worker, config = _worker(VALUE_SETS["gpu"])
    assert workload(docs, "worker")["kind"] == "Deployment"
    for section in ("requests", "limits"):
        assert worker["resources"][section]["nvidia.com/gpu"] == 2
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"} and spec["runtimeClassName"] == "nvidia"
    shm = next(v for v in spec["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "shm", "mountPath": "/dev/shm"} in worker["volumeMounts"]
    assert worker["image"] == "ghcr.io/deepspec/worker-gpu:0.1.0"
    assert config["DEEPSPEC_DEVICE"] == "cuda" and config["DEEPSPEC_DTYPE"] == "bfloat16"


def test_deepspec_worker_flags_come_from_the_configmap():
    docs, spec, worker, config = _worker({})
    assert worker["command"] == ["python", "-m", "service", "worker"]
    args = worker["args"]
    for flag, key in (
        ("--target", "DEEPSPEC_TARGET"),
        ("--draft", "DEEPSPEC_DRAFT"),
        ("--device", "DEEPSPEC_DEVICE"),
        ("--dtype", "DEEPSPEC_DTYPE"),
        ("--max-batch-size", "DEEPSPEC_MAX_BATCH_SIZE"),
    ):
        assert f"{flag}=$({key})" in args and key in config
    assert "--port=8001" in args and "--metrics-port=8002" in args
    assert not any(a.startswith("--bundle-dir") for a in args)  # bundles.source=none
    assert worker["envFrom"] == [{"configMapRef": {"name": one(docs, "ConfigMap", "model")["metadata"]["name"]}}]
    # Editing model settings rolls the workers.
    before = workload(docs, "worker")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    after = workload(render({"model": {"target": "/models/other"}}), "worker")["spec"]["template"]["metadata"]
    assert after["annotations"]["checksum/config"] != before


def test_worker_probes_give_slow_model_loads_a_startup_budget():
    _, spec, worker, _ = _worker({"worker": {"startupBudgetSeconds": 601}})
    startup = worker["startupProbe"]
    assert startup["grpc"] == {"port": 8001}
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 601
    assert startup["periodSeconds"] * (startup["failureThreshold"] - 1) < 601
    assert worker["readinessProbe"]["grpc"] == {"port": 8001}  # grpc.health.v1 = ServerReady
    assert worker["livenessProbe"]["tcpSocket"] == {"port": "grpc"}  # cheap: never kills a busy worker
    assert spec["terminationGracePeriodSeconds"] > 45


def test_cpu_worker_requests_no_gpu():
    docs, spec, worker, config = _worker(VALUE_SETS["cpu"])
    text = json.dumps(manifests(docs))
    assert "nvidia.com/gpu" not in text
    assert "tolerations" not in spec
    assert worker["image"] == "ghcr.io/deepspec/worker-cpu:0.1.0"
    assert config["DEEPSPEC_DEVICE"] == "cpu" and config["DEEPSPEC_DTYPE"] == "bfloat16"


def test_export_init_container_builds_the_bundle_before_the_worker():
    docs, spec, worker, config = _worker(VALUE_SETS["cpu-export-onnx"])
    init = container(spec, "export-bundle")
    script = init["args"][0]
    assert "python -m export" in script and '--format "$DEEPSPEC_EXPORT_FORMAT"' in script
    assert config["DEEPSPEC_EXPORT_FORMAT"] == "pytorch"  # what the deepspec worker serves
    assert "--bundle-dir=$(DEEPSPEC_BUNDLE_DIR)" in worker["args"]
    bundles = next(v for v in spec["volumes"] if v["name"] == "bundles")
    assert "emptyDir" in bundles
    assert {"name": "bundles", "mountPath": "/bundles"} in init["volumeMounts"]
    assert {"name": "bundles", "mountPath": "/bundles", "readOnly": True} in worker["volumeMounts"]
    assert config["DEEPSPEC_BUNDLE_DIR"] == "/bundles/bundle" and config["DEEPSPEC_BUNDLE_SOURCE"] == "export"
    # Skips a finished export, never trusts a partial one.
    assert "manifest.json" in script and ".partial" in script


def test_triton_runtime_runs_stock_tritonserver_on_the_exported_repository():
    docs, spec, worker, config = _worker(VALUE_SETS["triton"])
    sts = workload(docs, "worker")
    assert sts["kind"] == "StatefulSet" and not find(docs, "Deployment", "worker")
    assert sts["spec"]["serviceName"] == WORKER_SVC
    claim = sts["spec"]["volumeClaimTemplates"][0]
    assert claim["metadata"]["name"] == "bundles" and claim["spec"]["storageClassName"] == "fast-ssd"
    assert worker["image"].startswith("nvcr.io/nvidia/tritonserver:") and "trtllm" in worker["image"]
    assert worker["command"] == ["tritonserver"]
    assert "--model-repository=$(DEEPSPEC_TRITON_MODEL_REPOSITORY)" in worker["args"]
    assert {"--grpc-port=8001", "--metrics-port=8002", "--http-port=8000"} <= set(worker["args"])
    assert config["DEEPSPEC_TRITON_MODEL_REPOSITORY"] == "/bundles/triton-repo"
    assert config["DEEPSPEC_EXPORT_FORMAT"] == "triton-repo"
    assert worker["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert worker["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    init = container(spec, "export-bundle")
    assert init["image"].startswith("ghcr.io/deepspec/worker-gpu:")  # our export, Triton's server
    assert init["resources"]["limits"]["nvidia.com/gpu"] == 1  # trtllm-build needs the GPU
    assert "bundles" not in {v["name"] for v in spec["volumes"]}  # it is the per-replica claim


def test_bundles_from_a_pvc_are_mounted_read_only_and_kept_on_uninstall():
    docs, spec, worker, _ = _worker(VALUE_SETS["triton-pvc"])
    pvc = one(docs, "PersistentVolumeClaim")
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert pvc["metadata"]["name"].endswith("-bundles")
    volume = next(v for v in spec["volumes"] if v["name"] == "bundles")
    assert volume["persistentVolumeClaim"] == {"claimName": pvc["metadata"]["name"], "readOnly": True}
    assert "initContainers" not in spec
    docs = render({"worker": {"bundles": {"source": "pvc", "pvc": {"existingClaim": "bundles-v3"}}}})
    assert not find(docs, "PersistentVolumeClaim")
    spec = workload(docs, "worker")["spec"]["template"]["spec"]
    assert (
        next(v for v in spec["volumes"] if v["name"] == "bundles")["persistentVolumeClaim"]["claimName"] == "bundles-v3"
    )


def test_a_bundle_baked_into_the_image_needs_no_volume():
    _, spec, worker, _ = _worker(VALUE_SETS["bundle-in-image"])
    assert "--bundle-dir=$(DEEPSPEC_BUNDLE_DIR)" in worker["args"]
    assert not any(a.startswith(("--target", "--draft")) for a in worker["args"])  # the manifest names them
    assert "bundles" not in {v["name"] for v in spec["volumes"]} and "initContainers" not in spec


def test_network_policy_lets_only_the_gateway_reach_worker_grpc():
    docs = render()
    policy = one(docs, "NetworkPolicy", "worker")
    worker_labels = workload(docs, "worker")["spec"]["template"]["metadata"]["labels"]
    gateway_labels = workload(docs, "gateway")["spec"]["template"]["metadata"]["labels"]
    assert matches(policy["spec"]["podSelector"]["matchLabels"], worker_labels)
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    grpc_rule, metrics_rule = policy["spec"]["ingress"]
    assert grpc_rule["ports"] == [{"port": "grpc", "protocol": "TCP"}]
    [peer] = grpc_rule["from"]
    assert set(peer) == {"podSelector"} and matches(peer["podSelector"]["matchLabels"], gateway_labels)
    assert not matches(peer["podSelector"]["matchLabels"], worker_labels)
    assert metrics_rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert not find(render({"networkPolicy": {"enabled": False}}), "NetworkPolicy")


# --- Monitoring objects -------------------------------------------------------------------------------------


def test_operator_objects_are_skipped_on_clusters_without_the_crds():
    docs = render()
    assert not find(docs, "ServiceMonitor") and not find(docs, "PrometheusRule")
    assert "no monitoring.coreos.com/v1 API" in render_files()["deepspec/templates/NOTES.txt"]
    docs = render(VALUE_SETS["gpu"])
    assert {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in find(docs, "ServiceMonitor")} == {
        "gateway",
        "worker",
    }
    assert len(find(docs, "PrometheusRule")) == 1


def test_service_monitor_labels_are_configurable():
    docs = render(
        {
            **VALUE_SETS["gpu"],
            "monitoring": {
                "skipWithoutCRDs": False,
                "serviceMonitor": {"labels": {"release": "kube-prometheus-stack"}, "interval": "5s"},
            },
        }
    )
    for sm in find(docs, "ServiceMonitor"):
        assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        assert sm["spec"]["endpoints"][0]["interval"] == "5s"
        assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}


def test_dashboards_ship_as_labelled_configmaps():
    docs = [d for d in find(render(), "ConfigMap", "dashboards")]
    dashboards = sorted(p.name for p in (CHART_DIR / "dashboards").glob("*.json"))
    assert len(docs) == len(dashboards) >= 3
    for cm in docs:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        [(name, text)] = cm["data"].items()
        assert json.loads(text) == json.loads((CHART_DIR / "dashboards" / name).read_text())


def test_monitoring_off_renders_no_monitoring_objects():
    docs = render(VALUE_SETS["monitoring-off"])
    assert not find(docs, "ServiceMonitor") and not find(docs, "PrometheusRule")
    assert not find(docs, "ConfigMap", "dashboards")
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet"):
            assert "prometheus.io/scrape" not in d["spec"]["template"]["metadata"].get("annotations", {})


def test_every_resource_carries_the_standard_labels():
    for d in render(VALUE_SETS["gpu"]):
        labels = d["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "deepspec"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/part-of"] == "deepspec"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"] == "deepspec-0.1.0"
        assert d["metadata"]["namespace"] == NAMESPACE
        assert len(d["metadata"]["name"]) <= 63


# --- The chart's command lines against the service's real CLI ----------------------------------------------


def _command_lines(values: dict) -> list[list[str]]:
    """`python -m service ...` argument lists of the gateway and worker, `$(VAR)` expanded from the ConfigMap."""
    docs = render(values)
    config = one(docs, "ConfigMap", "model")["data"]
    lines = []
    for component in ("gateway", "worker"):
        c = container(workload(docs, component)["spec"]["template"]["spec"], component)
        if c["command"][:3] != ["python", "-m", "service"]:
            continue  # tritonserver
        args = c["command"][3:] + c["args"]
        for key, value in config.items():
            args = [a.replace(f"$({key})", value) for a in args]
        lines.append(args)
    return lines


@pytest.mark.parametrize("name", VALUE_SETS)
def test_command_lines_parse_with_the_service_cli(name):
    import argparse

    from service.cli import build_parser

    parser = build_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for args in _command_lines(VALUE_SETS[name]):
        assert not any("$(" in a for a in args), args
        known = {opt for action in subcommands[args[0]]._actions for opt in action.option_strings}
        unknown = sorted({a.split("=")[0] for a in args[1:] if a.startswith("--")} - known)
        assert not unknown, f"flags service/cli.py does not know: {unknown}"
        parsed = parser.parse_args(args)  # SystemExit on a bad value
        assert parsed.command == args[0]
