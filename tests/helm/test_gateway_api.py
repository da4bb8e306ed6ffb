"""The chart's Gateway API objects (templates/httproute.yaml, templates/inferencepool.yaml): off by default, and when
on, an InferencePool and an HTTPRoute that pass the schemas of their CRDs and point at what the chart deploys.

kubernetes-validate knows neither kind (both are CRDs), and their upstream CRDs are large: tests/helm/schemas holds
JSON schemas written from them (each file's `$comment` names the release and file read), strict about unknown
fields as the API server's pruning is. The NetworkPolicy beside the pool is a built-in kind: kubernetes-validate.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
from helm_python import lint
from helm_python.errors import HelmError

from tests.helm.conftest import CHART_DIR, NAMESPACE, RELEASE, VALUE_SETS, find, manifests, one, render

SCHEMAS = Path(__file__).parent / "schemas"
GATEWAY = [{"name": "inference-gateway", "namespace": "gateways", "sectionName": "https"}]
#: an engine runtime (its pods serve the OpenAI API) behind an InferencePool, routed from a Gateway
POOL = {
    **VALUE_SETS["vllm"],
    "gatewayAPI": {
        "inferencePool": {"enabled": True, "allowFrom": [{"namespaceSelector": {"matchLabels": {"name": "gateways"}}}]},
        "httpRoute": {
            "enabled": True,
            "parentRefs": GATEWAY,
            "hostnames": ["llm.example.com"],
            "requestTimeout": "600s",
        },
    },
}
#: DeepSpec's own runtime: the route goes to the gateway's Service
ROUTE_ONLY = {"gatewayAPI": {"httpRoute": {"enabled": True, "parentRefs": GATEWAY}}}


@functools.cache
def schema(kind: str) -> dict:
    name = {
        "InferencePool": "inference.networking.k8s.io_v1_inferencepool.json",
        "HTTPRoute": "gateway.networking.k8s.io_v1_httproute.json",
    }[kind]
    return json.loads((SCHEMAS / name).read_text())


def validate(doc: dict) -> None:
    jsonschema.validate(doc, schema(doc["kind"]), cls=jsonschema.Draft7Validator)


def test_off_by_default():
    for values in (VALUE_SETS["default"], VALUE_SETS["vllm"]):
        docs = render(values)
        assert not find(docs, "InferencePool") and not find(docs, "HTTPRoute")


@pytest.mark.parametrize("values", [POOL, ROUTE_ONLY], ids=["pool", "route-only"])
def test_objects_pass_their_schemas_and_the_chart_lints(values):
    docs = manifests(render(values))
    kinds = {"HTTPRoute"} | ({"InferencePool"} if values is POOL else set())
    assert {d["kind"] for d in docs} >= kinds
    for doc in docs:
        if doc["kind"] in kinds:
            validate(doc)
        elif doc["kind"] == "NetworkPolicy":
            kubernetes_validate.validate(doc, "1.30.0", strict=True)
    report = lint(CHART_DIR, values, strict=True, namespace=NAMESPACE, kube_version="v1.30.0")
    assert not report["errors"] and not [m for m in report["messages"] if m["severity"] >= 2], report


def test_the_pool_selects_the_worker_pods_on_their_openai_port():
    docs = render(POOL)
    pool = one(docs, "InferencePool")["spec"]
    worker = one(docs, "Deployment", "worker")["spec"]["template"]
    labels = worker["metadata"]["labels"]
    assert pool["selector"]["matchLabels"].items() <= labels.items()
    gateway_labels = one(docs, "Deployment", "gateway")["spec"]["template"]["metadata"]["labels"]
    assert not pool["selector"]["matchLabels"].items() <= gateway_labels.items()  # the workers alone
    [container] = [c for c in worker["spec"]["containers"] if c["name"] == "worker"]
    http = next(p["containerPort"] for p in container["ports"] if p["name"] == "http")
    assert pool["targetPorts"] == [{"number": http}]
    assert pool["endpointPickerRef"] == {"name": f"{RELEASE}-epp", "port": {"number": 9002}, "failureMode": "FailClose"}
    # the workers' own policy admits only the gateway; the pool's admits the Gateway's proxies and the picker
    policy = next(p for p in find(docs, "NetworkPolicy") if p["metadata"]["name"].endswith("-inference-pool"))
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["ingress"] == [
        {"from": POOL["gatewayAPI"]["inferencePool"]["allowFrom"], "ports": [{"port": "http", "protocol": "TCP"}]}
    ]


def test_the_route_goes_to_the_pool_or_to_the_gateway_service():
    route = one(render(POOL), "HTTPRoute")["spec"]
    assert route["parentRefs"] == GATEWAY and route["hostnames"] == ["llm.example.com"]
    [rule] = route["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/v1"}}]
    assert rule["backendRefs"] == [
        {
            "group": "inference.networking.k8s.io",
            "kind": "InferencePool",
            "name": one(render(POOL), "InferencePool")["metadata"]["name"],
        }
    ]
    assert rule["timeouts"] == {"request": "600s"}
    docs = render(ROUTE_ONLY)
    [rule] = one(docs, "HTTPRoute")["spec"]["rules"]
    service = one(docs, "Service", "gateway")
    http = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "http")
    assert rule["backendRefs"] == [{"name": service["metadata"]["name"], "port": http}]
    assert "timeouts" not in rule and not find(docs, "InferencePool")


@pytest.mark.parametrize(
    "values, message",
    [
        ({"gatewayAPI": {"inferencePool": {"enabled": True}}}, "worker.runtime=deepspec workers speak KServe v2 gRPC"),
        (
            {**VALUE_SETS["triton"], "gatewayAPI": {"inferencePool": {"enabled": True}}},
            "worker.runtime=triton workers speak KServe v2 gRPC",
        ),
        ({"gatewayAPI": {"httpRoute": {"enabled": True}}}, "parentRefs: the Gateway"),
        ({**POOL, "gatewayAPI": {"inferencePool": {"enabled": True, "allowFrom": []}}}, "allowFrom: the peers"),
        ({"gatewayAPI": {"inferencePool": {"endpointPicker": {"failureMode": "Sometimes"}}}}, "failureMode"),
    ],
)
def test_a_pool_or_route_that_cannot_work_is_refused(values, message):
    with pytest.raises(HelmError, match=message):
        render(values)


@pytest.mark.parametrize(
    "kind, breakage, message",
    [
        ("InferencePool", lambda s: s.pop("targetPorts"), "targetPorts"),
        ("InferencePool", lambda s: s["targetPorts"].append(dict(s["targetPorts"][0])), "non-unique"),
        ("InferencePool", lambda s: s["endpointPickerRef"].update(failureMode="Sometimes"), "Sometimes"),
        ("InferencePool", lambda s: s["endpointPickerRef"].pop("port"), "port"),
        ("InferencePool", lambda s: s["selector"].update(matchExpressions=[]), "matchExpressions"),
        ("HTTPRoute", lambda s: s["rules"][0]["matches"][0]["path"].update(type="Prefix"), "Prefix"),
        ("HTTPRoute", lambda s: s["rules"][0]["matches"][0]["path"].update(value="v1"), "v1"),
        ("HTTPRoute", lambda s: s["rules"][0].update(timeouts={"request": "10 minutes"}), "10 minutes"),
        ("HTTPRoute", lambda s: s["parentRefs"][0].pop("name"), "name"),
        ("HTTPRoute", lambda s: [s["rules"][0]["backendRefs"][0].pop(k) for k in ("group", "kind")], "port"),
    ],
)
def test_the_schemas_catch_a_broken_object(kind, breakage, message):
    """The check can fail: a missing required field, a duplicate port, a value outside an enum or a pattern, a field
    the CRD does not have."""
    doc = one(manifests(render(POOL)), kind)
    validate(doc)
    breakage(doc["spec"])
    with pytest.raises(jsonschema.ValidationError, match=message):
        validate(doc)
