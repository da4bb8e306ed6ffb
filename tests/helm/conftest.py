"""Render helm/deepspec offline with the real Helm library (helm-python-sdk wraps Helm's Go code in a shared
library: no binary, no cluster) and hand tests the manifests as parsed objects.

Value sets name the deployments the chart promises; tests parametrize over them.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import yaml
from helm_python import Chart

from tests.tools import require_tool as find_tool

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "helm" / "deepspec"
RELEASE, NAMESPACE = "deepspec", "inference"

# Render the Prometheus Operator objects too: offline there is no cluster to ask for its CRDs.
_CRDS = {"monitoring": {"skipWithoutCRDs": False}}

VALUE_SETS: dict[str, dict] = {
    "default": {},
    "gpu": {
        **_CRDS,
        "worker": {
            "device": "cuda",
            "replicaCount": 4,
            "gpu": {"count": 2},
            "nodeSelector": {"nvidia.com/gpu.present": "true"},
            "runtimeClassName": "nvidia",
        },
    },
    "cpu": {**_CRDS, "worker": {"device": "cpu"}},
    "cpu-export-onnx": {**_CRDS, "worker": {"device": "cpu", "bundles": {"source": "export"}}},
    "triton": {
        **_CRDS,
        "worker": {
            "runtime": "triton",
            "bundles": {"source": "export"},
            "perReplicaVolume": {"enabled": True, "storageClass": "fast-ssd"},
        },
    },
    "triton-pvc": {**_CRDS, "worker": {"runtime": "triton", "bundles": {"source": "pvc"}, "pdb": {"enabled": True}}},
    "bundle-in-image": {**_CRDS, "worker": {"bundles": {"source": "image"}}},
    # The engines' own OpenAI servers, each on the launch script its export wrote (tests/helm/test_engine_runtimes.py).
    "vllm": {
        **_CRDS,
        "worker": {
            "runtime": "vllm",
            "bundles": {"source": "export"},
            "gpu": {"count": 2},
            "openai": {"tensorParallel": 2},
        },
    },
    "sglang": {
        **_CRDS,
        "worker": {
            "runtime": "sglang",
            "bundles": {"source": "export"},
            "perReplicaVolume": {"enabled": True, "storageClass": "fast-ssd"},
        },
    },
    "trtllm-serve": {
        **_CRDS,
        "worker": {"runtime": "trtllm-serve", "bundles": {"source": "export"}},
        "gateway": {"discovery": "endpointslices"},
    },
    "ingress": {
        **_CRDS,
        "ingress": {
            "enabled": True,
            "className": "nginx",
            "tls": [{"secretName": "deepspec-tls", "hosts": ["deepspec.example.com"]}],
        },
    },
    "endpointslices": {
        **_CRDS,
        "gateway": {"discovery": "endpointslices", "autoscaling": {"customMetric": {"enabled": True}}},
    },
    "existing-secret": {**_CRDS, "apiKeys": {"existingSecret": "my-keys", "secretKey": "keys"}},
    "no-auth-no-hpa": {**_CRDS, "apiKeys": {"enabled": False}, "gateway": {"autoscaling": {"enabled": False}}},
    "monitoring-off": {
        "monitoring": {
            "podAnnotations": False,
            "serviceMonitor": {"enabled": False},
            "prometheusRule": {"enabled": False},
            "dashboards": {"enabled": False},
        }
    },
    # Production profiles, read as an operator would: every knob issue-16-style production needs, turned on.
    "prod-triton-pvc": {
        **_CRDS,
        "apiKeys": {"generate": False, "existingSecret": "deepspec-api-keys"},
        "worker": {
            "runtime": "triton",
            "device": "cuda",
            "bundles": {"source": "pvc"},
            "gpu": {"count": 2, "architectures": ["hopper"]},
            "triton": {"tensorParallel": 2},
            "modelCache": {"type": "pvc", "size": "200Gi"},
            "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 6},
            "nodeSelector": {"nvidia.com/gpu.present": "true"},
        },
        "ingress": {"enabled": True, "className": "nginx"},
    },
    "prod-export-sts": {
        **_CRDS,
        "apiKeys": {"generate": False, "keys": ["sk-prod-1", "sk-prod-2"]},
        "worker": {
            "device": "cuda",
            "bundles": {"source": "export"},
            "perReplicaVolume": {"enabled": True, "storageClass": "fast-ssd", "size": "100Gi"},
            "extraEnv": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}],
            "autoscaling": {"enabled": True},
        },
        "gateway": {"discovery": "endpointslices"},
    },
}

#: the default and the two production profiles: checkov and the CRD checks run on these
PROFILES = ("default", "prod-triton-pvc", "prod-export-sts")
#: the engine runtimes' profiles: checkov runs on these as well
RUNTIME_PROFILES = ("vllm", "sglang", "trtllm-serve")


@functools.lru_cache(maxsize=1)
def chart() -> Chart:
    return Chart.load(CHART_DIR)


def render_files(values: dict | None = None) -> dict[str, str]:
    """Template path -> rendered text, as `helm template` would print it."""
    return chart().render(copy.deepcopy(values or {}), name=RELEASE, namespace=NAMESPACE)


@functools.cache
def _render_cached(values_json: str) -> tuple[dict, ...]:
    docs = []
    for path, text in render_files(json.loads(values_json)).items():
        if not path.endswith((".yaml", ".yml")):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                doc.setdefault("metadata", {}).setdefault("annotations", {})
                docs.append({"__template__": path, **doc})
    return tuple(docs)


def render(values: dict | None = None) -> list[dict]:
    """Every manifest the chart renders for `values`, each tagged with its template under `__template__`."""
    return copy.deepcopy(list(_render_cached(json.dumps(values or {}, sort_keys=True))))


def manifests(docs: list[dict]) -> list[dict]:
    """The documents without the test helper's `__template__` tag (what Kubernetes would receive)."""
    return [{k: v for k, v in d.items() if k != "__template__"} for d in docs]


def find(docs: list[dict], kind: str, component: str | None = None) -> list[dict]:
    found = [d for d in docs if d["kind"] == kind]
    if component is not None:
        found = [d for d in found if d["metadata"]["labels"].get("app.kubernetes.io/component") == component]
    return found


def one(docs: list[dict], kind: str, component: str | None = None) -> dict:
    found = find(docs, kind, component)
    assert len(found) == 1, f"expected one {kind} {component or ''}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def workload(docs: list[dict], component: str) -> dict:
    """The Deployment or StatefulSet of a component."""
    found = [
        d
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet")
        and d["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    assert len(found) == 1, found
    return found[0]


def container(pod_spec: dict, name: str) -> dict:
    return next(c for c in pod_spec["containers"] + pod_spec.get("initContainers", []) if c["name"] == name)


def pod_specs(docs: list[dict]) -> list[tuple[str, dict]]:
    """(name, pod spec) of every pod the chart would run: workloads and the helm test pod."""
    specs = [
        (d["metadata"]["name"], d["spec"]["template"]["spec"])
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet", "Job", "DaemonSet")
    ]
    specs += [(d["metadata"]["name"], d["spec"]) for d in docs if d["kind"] == "Pod"]
    return specs


def require_tool(name: str) -> str:
    """Path of a Prometheus tool (promtool, prometheus); see tests/tools.py."""
    return find_tool(name, how="`make system-deps` installs it (Debian package prometheus)")
