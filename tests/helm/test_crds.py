"""The chart's custom resources against the OpenAPI schemas of their CRDs (tests/helm/crds, see its README).

kubernetes-validate knows only built-in kinds; a typo in a ServiceMonitor, PrometheusRule or ScaledObject field
would otherwise reach the cluster, where the API server prunes unknown fields without a word. So every object is
checked with jsonschema against its CRD's `openAPIV3Schema`, made strict the way the API server's pruning is:
an object with declared properties accepts no others.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.helm.conftest import PROFILES, RUNTIME_PROFILES, VALUE_SETS, find, manifests, render

CRD_DIR = Path(__file__).parent / "crds"
CUSTOM_KINDS = ("ServiceMonitor", "PrometheusRule", "ScaledObject")
# Profiles with every custom resource on: the production ones (KEDA on), the gpu one (monitoring, no KEDA) and the
# engine runtimes (their own metric names and scrape paths).
VALUES = {
    name: {**VALUE_SETS[name], "monitoring": {"skipWithoutCRDs": False}}
    for name in (*PROFILES, "gpu", "triton", *RUNTIME_PROFILES)
}


def _strict(schema: dict) -> dict:
    """Reject unknown fields wherever the CRD lists its fields (what the API server would silently drop).
    Go's regexp takes `^(?i)…`; Python wants inline flags first, so they move to the front."""
    if isinstance(schema, dict):
        pattern = schema.get("pattern")
        if isinstance(pattern, str) and "(?i)" in pattern and not pattern.startswith("(?i)"):
            schema["pattern"] = "(?i)" + pattern.replace("(?i)", "")
        if (
            schema.get("type") == "object"
            and "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        for value in schema.values():
            _strict(value)
    elif isinstance(schema, list):
        for value in schema:
            _strict(value)
    return schema


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> the strict JSON schema of that served version."""
    schemas = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version.get("served"):
                schemas[(f"{group}/{version['name']}", kind)] = _strict(
                    copy.deepcopy(version["schema"]["openAPIV3Schema"])
                )
    return schemas


def validate(doc: dict) -> None:
    schema = crd_schemas()[(doc["apiVersion"], doc["kind"])]
    jsonschema.validate(doc, schema, cls=jsonschema.Draft7Validator)


def test_every_custom_kind_has_its_crd():
    assert {kind for _, kind in crd_schemas()} >= set(CUSTOM_KINDS)


@pytest.mark.parametrize("name", VALUES)
def test_custom_resources_match_their_crd_schemas(name):
    docs = manifests(render(VALUES[name]))
    custom = [d for d in docs if d["kind"] in CUSTOM_KINDS]
    expected = {"ServiceMonitor", "PrometheusRule"} | ({"ScaledObject"} if name in PROFILES[1:] else set())
    assert {d["kind"] for d in custom} == expected
    for doc in custom:
        try:
            validate(doc)
        except jsonschema.ValidationError as e:
            pytest.fail(f"{doc['kind']} {doc['metadata']['name']}: {e.message} at {list(e.absolute_path)}")


@pytest.mark.parametrize(
    "kind, breakage, message",
    [
        ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].update(intervall="5s"), "intervall"),
        ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].update(scheme="ftp"), "ftp"),
        ("PrometheusRule", lambda d: d["spec"]["groups"][0]["rules"][0].pop("expr"), "expr"),
        ("ScaledObject", lambda d: d["spec"].pop("scaleTargetRef"), "scaleTargetRef"),
        ("ScaledObject", lambda d: d["spec"]["triggers"][0].pop("type"), "type"),
    ],
)
def test_the_schemas_catch_a_broken_object(kind, breakage, message):
    """The check can fail: a misspelt field, a bad enum value or a missing required field is an error."""
    [doc] = find(manifests(render(VALUE_SETS["prod-triton-pvc"])), kind)[:1]
    validate(doc)
    breakage(doc)
    with pytest.raises(jsonschema.ValidationError, match=message):
        validate(doc)
