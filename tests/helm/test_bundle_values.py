"""The chart's bundle values (issue 43 item 3): an export's output is a bundle, so `worker.bundles.*` names where the
worker's bundle comes from (`DEEPSPEC_BUNDLE_SOURCE`, `DEEPSPEC_BUNDLE_DIR`, the `bundles` volume and claim). An older
values file's `worker.engines.*` is read for one release, a key where its `worker.bundles` twin is left at the
default, renders the same manifests as the same keys under `worker.bundles`, and NOTES says to rename it."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.helm.conftest import CHART_DIR, VALUE_SETS, manifests, one, render, render_files, workload

NOTES = "deepspec/templates/NOTES.txt"

#: `worker.bundles` settings an operator writes, one per way a bundle reaches the worker, with the maps
#: (`pvc`, `export`, `export.resources`) set in part so the merge with the defaults is exercised
BUNDLE_SETTINGS: dict[str, dict] = {
    "image at an old path": {"source": "image", "mountPath": "/engines", "subPath": "engine"},
    "created claim": {"source": "pvc", "pvc": {"size": "80Gi", "storageClass": "fast-ssd"}},
    "existing claim": {"source": "pvc", "pvc": {"existingClaim": "deepspec-engines"}},
    "export": {
        "source": "export",
        "emptyDirSizeLimit": "90Gi",
        "export": {
            "format": "onnx",
            "extraArgs": ["--quantization", "int8"],
            "resources": {"limits": {"memory": "8Gi"}},
        },
    },
}


def _same_key(values: dict) -> dict:
    """`values` with a fixed API key where the chart would generate one (a random key differs between renders)."""
    keys = values.get("apiKeys", {})
    if keys.get("existingSecret") or keys.get("keys"):
        return values
    return {**values, "apiKeys": {**keys, "generate": False, "keys": ["sk-test"]}}


def _old_style(values: dict) -> dict:
    """`values` as an older values file spells it: `worker.bundles` under its previous name."""
    worker = dict(values["worker"])
    worker["engines"] = worker.pop("bundles")
    return {**values, "worker": worker}


def _worker_spec(values: dict) -> dict:
    return workload(render(values), "worker")["spec"]["template"]["spec"]


def test_the_merges_defaults_are_values_yaml():
    """The helper compares old keys against a copy of values.yaml's `worker.bundles`: the two must not drift."""
    helpers = (CHART_DIR / "templates" / "_helpers.tpl").read_text()
    body = re.search(r'define "deepspec\.worker\.bundleDefaults" -}}\n(.*?)\{\{- end }}', helpers, re.S)
    assert body is not None
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert yaml.safe_load(body[1]) == values["worker"]["bundles"]
    assert values["worker"]["engines"] == {}  # an old key is only ever what the user set


@pytest.mark.parametrize("name", list(BUNDLE_SETTINGS))
@pytest.mark.parametrize("runtime", ["deepspec", "triton"])
def test_an_old_values_file_renders_what_the_new_keys_render(name, runtime):
    settings = BUNDLE_SETTINGS[name]
    if runtime == "triton" and settings.get("export", {}).get("format"):
        settings = {**settings, "export": {**settings["export"], "format": "triton-repo"}}
    new = {"worker": {"runtime": runtime, "device": "cuda", "bundles": settings}}
    new = _same_key(new)
    assert manifests(render(_old_style(new))) == manifests(render(new))


@pytest.mark.parametrize("name", [n for n, v in VALUE_SETS.items() if "bundles" in v.get("worker", {})])
def test_every_profile_renders_the_same_from_old_keys(name):
    new = _same_key(VALUE_SETS[name])
    assert manifests(render(_old_style(new))) == manifests(render(new))


def test_the_new_names_reach_the_pod():
    docs = render({"worker": {"bundles": {"source": "pvc"}}})
    config = one(docs, "ConfigMap", "model")["data"]
    assert config["DEEPSPEC_BUNDLE_SOURCE"] == "pvc" and config["DEEPSPEC_BUNDLE_DIR"] == "/bundles/bundle"
    assert not [key for key in config if key.startswith("DEEPSPEC_ENGINE")]
    claim = one(docs, "PersistentVolumeClaim")["metadata"]["name"]
    spec = workload(docs, "worker")["spec"]["template"]["spec"]
    assert {"name": "bundles", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}} in spec["volumes"]
    assert claim.endswith("-bundles")


def test_a_key_set_under_the_new_name_wins_and_an_unset_one_is_read_from_the_old():
    values = {
        "worker": {
            "bundles": {"source": "pvc", "pvc": {"size": "10Gi"}},
            "engines": {"source": "export", "pvc": {"size": "99Gi", "storageClass": "slow-hdd"}, "subPath": "v2"},
        }
    }
    docs = render(values)
    claim = one(docs, "PersistentVolumeClaim")["spec"]
    assert claim["resources"]["requests"]["storage"] == "10Gi" and claim["storageClassName"] == "slow-hdd"
    assert one(docs, "ConfigMap", "model")["data"]["DEEPSPEC_BUNDLE_DIR"] == "/bundles/v2"
    assert "initContainers" not in _worker_spec(values)  # source pvc: the new key's


def test_an_old_resources_map_merges_into_the_default_as_helm_merges_values():
    values = {"worker": {"engines": {"source": "export", "export": {"resources": {"limits": {"memory": "8Gi"}}}}}}
    init = next(c for c in _worker_spec(values)["initContainers"] if c["name"] == "export-bundle")
    assert init["resources"]["limits"]["memory"] == "8Gi" and init["resources"]["requests"]["cpu"] == "2"


def test_the_notes_say_which_old_keys_to_rename():
    notes = render_files({"worker": {"engines": {"source": "pvc", "pvc": {"size": "80Gi"}}}})[NOTES]
    assert "DEPRECATED: worker.engines is now worker.bundles" in notes
    assert "worker.engines.pvc, worker.engines.source" in notes
    # the claim an earlier release created under the old name is kept, and the notes say how to go on using it
    assert "deepspec-engines" in notes and "worker.bundles.pvc.existingClaim" in notes
    assert "worker.bundles.subPath=engine" in notes  # the bundle's folder in the claim was `engine` by default
    assert "DEPRECATED" not in render_files({"worker": {"bundles": {"source": "pvc"}}})[NOTES]
    image = render_files({"worker": {"engines": {"source": "image", "subPath": "v2"}}})[NOTES]
    assert "DEPRECATED" in image and "subPath=engine" not in image  # a path the old file names is kept


def test_the_deprecated_keys_are_checked_by_the_same_schema():
    from helm_python.errors import HelmError

    with pytest.raises(HelmError, match="schema"):
        render_files({"worker": {"engines": {"mountpath": "/x"}}})  # a typo of mountPath
