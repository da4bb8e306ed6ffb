"""docker/images.py: the Triton + TensorRT-LLM tag table, what DeepSpec needs from the image, and the pin.

Every reference to NVIDIA's Triton image anywhere in the repository (Dockerfiles, chart values and rendered
templates, export launch snippets, docs) must name a tag of the table that meets every requirement, and it must be the
pinned one: the worker-gpu image builds engines with its TensorRT-LLM and the chart's Triton serves them, and a
TensorRT engine loads only in the TensorRT it was built with.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from packaging.version import InvalidVersion, Version

from tests.docker import load_script

REPO = Path(__file__).resolve().parents[2]
#: `tritonserver:<yy.mm>...`, the tag ending where an image reference does (digest, quote, space, backtick)
REFERENCE = re.compile(r"tritonserver:(\d{2}\.\d{2}[A-Za-z0-9._-]*)")
#: folders of data, not code or docs: prompt sets and generated answers mention no images
SKIPPED = ("datasets/", "training/data/")


images = load_script("deepspec_images", REPO / "docker" / "images.py")
images_docs = load_script("images_docs", REPO / "helm" / "tools" / "images_docs.py")


def repository_files() -> list[Path]:
    """Tracked and new (not ignored) files: what a commit of this tree holds."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    return [REPO / p for p in out if p and not p.startswith(SKIPPED) and (REPO / p).is_file()]


def _matches(paths: list[Path], pattern, root: Path) -> list[tuple]:
    """(`file:line`, *groups) of every match of `pattern` in the files' text, files named relative to `root`."""
    found = []
    for path in paths:
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            found += [(f"{path.relative_to(root)}:{number}", *m.groups()) for m in pattern.finditer(line)]
    return found


def text_references(paths: list[Path], root: Path = REPO) -> list[tuple[str, str]]:
    """(`file:line`, tag) of every `tritonserver:<tag>` in the files' text, files named relative to `root`."""
    return _matches(paths, REFERENCE, root)


def values_references(values_file: Path) -> list[tuple[str, str]]:
    """(`file: key`, tag) of every `{repository: nvcr.io/nvidia/tritonserver, tag: ...}` in a values file: the chart
    splits an image into two keys, so no `tritonserver:<tag>` string appears there."""
    found = []

    def walk(node, path):
        if isinstance(node, dict):
            if node.get("repository") == images.REPOSITORY:
                found.append((f"{values_file.relative_to(REPO)}: {'.'.join(path)}.tag", str(node.get("tag"))))
            for key, value in node.items():
                walk(value, path + [str(key)])

    walk(yaml.safe_load(values_file.read_text()), [])
    return found


def problems(references: list[tuple[str, str]]) -> list[str]:
    """Why each reference is wrong, naming where it is (empty: every one names the pinned, sufficient tag)."""
    out = []
    for where, tag in references:
        try:
            image = images.by_tag(tag)
        except KeyError as missing:
            out.append(f"{where}: {missing.args[0]}")
            continue
        out += [f"{where}: {line}" for line in images.unmet(image)]
        if image.release != images.PINNED:
            out.append(
                f"{where}: {image.tag} is not the pinned {images.pinned().tag} (docker/images.py PINNED): the "
                "worker image and the chart's Triton must be one release to load each other's engines"
            )
    return out


# --- the table ----------------------------------------------------------------------------------------------


def test_table_rows_are_unique_releases_newest_first_with_parseable_versions():
    releases = [i.release for i in images.IMAGES]
    assert len(set(releases)) == len(releases)
    assert releases == sorted(releases, key=lambda r: tuple(map(int, r.split("."))), reverse=True)
    for image in images.IMAGES:
        assert re.fullmatch(r"\d{2}\.\d{2}", image.release), image
        for component in images.COMPONENTS + ("min_driver",):
            Version(getattr(image, component))  # raises InvalidVersion on a typo


def test_requirements_name_known_components_and_versions():
    assert len({r.name for r in images.REQUIREMENTS}) == len(images.REQUIREMENTS)
    for r in images.REQUIREMENTS:
        assert r.component in images.COMPONENTS, r.name
        assert r.min_version or r.below_version, r.name
        for bound in (r.min_version, r.below_version):
            if bound is not None:
                Version(bound)
        assert r.needed_by and r.source, r.name


def test_each_requirement_is_still_used_where_it_says():
    """A requirement holds the pin back only while the code that needs it exists: when its use is gone, drop it."""
    for r in images.REQUIREMENTS:
        path, text = r.used_in
        assert text in (REPO / path).read_text(), f"{r.name}: {path} no longer contains {text!r}"


def test_by_tag_accepts_a_release_or_a_tag_and_names_the_known_tags():
    assert images.by_tag("26.07") == images.by_tag("26.07-trtllm-python-py3") == images.pinned()
    with pytest.raises(KeyError, match="26.07-trtllm-python-py3"):
        images.by_tag("24.01-trtllm-python-py3")
    with pytest.raises(KeyError):
        images.by_tag("26.07-py3")  # the plain flavour has no TensorRT-LLM


def test_version_bounds_compare_as_versions_not_strings():
    [aot] = [r for r in images.REQUIREMENTS if r.name == "tensorrt-aot-plugins"]
    assert aot.met_by(SimpleNamespace(tensorrt="10.14.1.48"))  # "10.14" < "10.9" as strings
    assert not aot.met_by(SimpleNamespace(tensorrt="10.8.0.43"))
    with pytest.raises(InvalidVersion):
        Version("25.01-trtllm")


# --- what the export needs, and the pin -----------------------------------------------------------------------


def test_the_pinned_release_meets_every_requirement():
    assert images.unmet(images.pinned()) == []


def test_the_pin_is_the_newest_release_that_meets_every_requirement():
    sufficient = [i.release for i in images.IMAGES if not images.unmet(i)]
    assert sufficient and sufficient[0] == images.PINNED


def test_the_release_the_issue_named_misses_what_the_export_uses():
    """25.01 (TensorRT-LLM 0.17, TensorRT 10.8) has no tensorrt.plugin.aot_impl and no EAGLE-3 config; 25.12
    (TensorRT-LLM 1.1.0) has the AOT plugins but no row of LLM-API rules in export/trtllm_releases.py."""
    old = {line.split(":", 1)[0] for line in images.unmet(images.by_tag("25.01"))}
    assert {"tensorrt-aot-plugins", "llmapi-eagle3-layers", "llmapi-speculative-rules"} <= old
    assert {line.split(":", 1)[0] for line in images.unmet(images.by_tag("25.12"))} == {"llmapi-speculative-rules"}


def test_the_pinned_images_carry_the_tensorrt_llm_whose_rules_the_export_writes():
    """One version chain: the Triton tag (docker/images.py PINNED) and the trtllm-serve image carry the TensorRT-LLM
    release export/trtllm_releases.py pins, and the requirement's range is exactly the releases with a row there.
    Should an image move to a release without a row, the export would write another release's rules."""
    from export import trtllm_releases

    assert images.pinned().tensorrt_llm == trtllm_releases.PINNED
    assert images.engine_image("trtllm-serve").version == trtllm_releases.PINNED
    [requirement] = [r for r in images.REQUIREMENTS if r.name == "llmapi-speculative-rules"]
    with_rules = {i.tensorrt_llm for i in images.IMAGES if requirement.met_by(i)}
    assert with_rules and with_rules <= set(trtllm_releases.RELEASES)
    assert all(requirement.met_by(SimpleNamespace(tensorrt_llm=v)) for v in trtllm_releases.RELEASES)


#: the `decoding_type` values TensorRT-LLM 1.2.1's `DecodingBaseConfig.from_dict` dispatches on
#: (NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py at v1.2.1); anything else raises
#: `ValueError("Invalid decoding type: ...")`. Written out here as read, so that a wrong table fails too.
TRTLLM_1_2_DECODING_TYPES = {
    "MTP",
    "Medusa",
    "Eagle",
    "Lookahead",
    "NGram",
    "DraftTarget",
    "SaveState",
    "UserProvided",
    "AUTO",
}


def test_the_exported_speculative_config_is_one_the_pinned_tensorrt_llm_dispatches():
    """What export/snippets.py writes into trtllm-serve.yaml and the Triton model.yaml must be dispatched by the
    pinned release's `DecodingBaseConfig.from_dict` (tensorrt_llm/llmapi/llm_args.py, v1.2.1): `Eagle3` is not
    (`Eagle3DecodingConfig` came after 1.2), so EAGLE-3 goes out as `Eagle` with `eagle3_one_model`."""
    from export import trtllm_releases
    from export.snippets import trtllm_llm_args

    draft = SimpleNamespace(algo="eagle3", cfg=SimpleNamespace(feature_layers=(1, 14, 27)))
    job = SimpleNamespace(tp=1, dtype="bfloat16", num_speculative_tokens=4, draft=draft)
    spec = trtllm_llm_args(job, "draft", "target")["speculative_config"]
    assert trtllm_releases.release(images.pinned().tensorrt_llm).decoding_types == TRTLLM_1_2_DECODING_TYPES
    assert spec["decoding_type"] in TRTLLM_1_2_DECODING_TYPES and spec["eagle3_one_model"] is True
    assert trtllm_releases.release().refusal(spec) is None
    assert trtllm_releases.release().refusal({**spec, "decoding_type": "Eagle3"}) == "Invalid decoding type: Eagle3"


# --- every reference in the repository ------------------------------------------------------------------------


def test_every_triton_image_reference_in_the_repository_names_the_pinned_tag():
    references = text_references(repository_files()) + values_references(REPO / "helm" / "deepspec" / "values.yaml")
    where = {w.split(":")[0] for w, _ in references}
    # the two places an image is pinned; the scan must see both, or it proves nothing
    assert {"docker/worker-gpu.Dockerfile", "helm/deepspec/values.yaml"} <= where, sorted(where)
    assert problems(references) == []


def test_a_reference_to_an_old_or_unknown_tag_fails_naming_the_file(tmp_path):
    """Negative control for the scan: an older tag and an unlisted one, each reported with its file and line."""
    old, unknown = "25.01-" + images.FLAVOUR, "27.01-" + images.FLAVOUR
    snippet = tmp_path / "export" / "launch.md"
    snippet.parent.mkdir()
    snippet.write_text(f"docker run {images.REPOSITORY}:{old}\nFROM {images.REPOSITORY}:{unknown}@sha256:abc\n")
    messages = problems(text_references([snippet, tmp_path / "missing.md"], root=tmp_path))
    assert any(m.startswith("export/launch.md:1:") and "tensorrt-aot-plugins" in m for m in messages), messages
    assert any(m.startswith("export/launch.md:1:") and "not the pinned" in m for m in messages), messages
    assert any(m.startswith("export/launch.md:2:") and "not in docker/images.py" in m for m in messages), messages


def test_values_scan_finds_the_split_repository_and_tag():
    values = REPO / "helm" / "deepspec" / "values.yaml"
    [(where, tag)] = values_references(values)
    assert where == "helm/deepspec/values.yaml: worker.triton.image.tag" and tag == images.pinned().tag


def test_every_rendered_triton_container_runs_the_pinned_image():
    """The chart's templates, not only its values: each value set the chart promises renders the pinned image
    wherever it runs Triton."""
    pytest.importorskip("helm_python")
    from tests.helm.conftest import VALUE_SETS, pod_specs, render

    seen = 0
    for name, values in VALUE_SETS.items():
        for pod, spec in pod_specs(render(values)):
            for c in spec["containers"] + spec.get("initContainers", []):
                if images.REPOSITORY in c["image"]:
                    seen += 1
                    assert c["image"] == images.pinned().reference, f"{name}: {pod}/{c['name']} runs {c['image']}"
    assert seen, "no value set runs Triton: the check above proved nothing"


def test_generated_image_tables_are_current():
    assert images_docs.main(["--check"]) == 0, "run python helm/tools/images_docs.py"
    docker_readme = (REPO / "docker" / "README.md").read_text()
    assert images.pinned().reference in docker_readme
    assert all(f"`{i.tag}`" in docker_readme for i in images.IMAGES)


# --- the engine images of worker.runtime vllm, sglang, trtllm-serve -------------------------------------------------

#: `<repository>:<tag>` of an engine image, the tag ending where an image reference does
ENGINE_REFERENCE = re.compile(
    "(" + "|".join(re.escape(i.repository) for i in images.ENGINE_IMAGES) + r"):([A-Za-z0-9][A-Za-z0-9._-]*)"
)


def engine_text_references(paths: list[Path], root: Path = REPO) -> list[tuple[str, str, str]]:
    """(`file:line`, repository, tag) of every engine image named in the files' text."""
    return _matches(paths, ENGINE_REFERENCE, root)


def engine_values_references(values_file: Path) -> list[tuple[str, str, str]]:
    """(`file: key`, repository, tag) of every `{repository: <engine image>, tag: ...}` in a values file."""
    repositories = {i.repository for i in images.ENGINE_IMAGES}
    found = []

    def walk(node, path):
        if isinstance(node, dict):
            if node.get("repository") in repositories:
                found.append(
                    (f"{values_file.relative_to(REPO)}: {'.'.join(path)}.tag", node["repository"], str(node.get("tag")))
                )
            for key, value in node.items():
                walk(value, path + [str(key)])

    walk(yaml.safe_load(values_file.read_text()), [])
    return found


def engine_problems(references: list[tuple[str, str, str]]) -> list[str]:
    """Why each engine image reference is wrong: a tag other than ENGINE_IMAGES pins for that repository."""
    pinned = {i.repository: i for i in images.ENGINE_IMAGES}
    return [
        f"{where}: {repository}:{tag} is not the pinned {pinned[repository].reference} (docker/images.py ENGINE_IMAGES)"
        for where, repository, tag in references
        if tag != pinned[repository].tag
    ]


def test_engine_images_name_one_pinned_release_per_runtime_that_serves_the_export():
    runtimes = [i.runtime for i in images.ENGINE_IMAGES]
    assert sorted(runtimes) == ["sglang", "trtllm-serve", "vllm"] and len(set(runtimes)) == len(runtimes)
    for image in images.ENGINE_IMAGES:
        assert Version(image.version) >= Version(image.min_version), image.runtime
        assert image.tag.lstrip("v") == image.version, image.runtime  # the tag names the release it carries
        assert image.needs and image.cuda, image.runtime
    with pytest.raises(KeyError, match="vllm"):
        images.engine_image("tgi")


def test_trtllm_serve_needs_the_release_the_exported_speculative_config_needs():
    """trtllm-serve reads the same `speculative_config` the Triton model does: its minimum is that requirement's."""
    [requirement] = [r for r in images.REQUIREMENTS if r.name == "llmapi-speculative-rules"]
    assert Version(images.engine_image("trtllm-serve").min_version) >= Version(requirement.min_version)
    assert requirement.met_by(SimpleNamespace(tensorrt_llm=images.engine_image("trtllm-serve").version))


def test_every_engine_image_reference_in_the_repository_names_the_pinned_tag():
    references = engine_text_references(repository_files()) + engine_values_references(
        REPO / "helm" / "deepspec" / "values.yaml"
    )
    assert {r for _, r, _ in references} == {i.repository for i in images.ENGINE_IMAGES}  # the values pin all three
    assert engine_problems(references) == []


def test_an_engine_reference_to_another_tag_fails_naming_the_file(tmp_path):
    """Negative control for the engine scan."""
    doc = tmp_path / "docs" / "serve.md"
    doc.parent.mkdir()
    old, current = images.engine_image("vllm").repository + ":v0.10.0", images.engine_image("sglang").reference
    doc.write_text(f"docker run {old}\nFROM {current}\n")
    messages = engine_problems(engine_text_references([doc], root=tmp_path))
    assert len(messages) == 1 and messages[0].startswith("docs/serve.md:1:") and "v0.10.0" in messages[0]


def test_every_rendered_engine_container_runs_the_pinned_image():
    pytest.importorskip("helm_python")
    from tests.helm.conftest import RUNTIME_PROFILES, VALUE_SETS, container, render, workload

    for name in RUNTIME_PROFILES:
        runtime = VALUE_SETS[name]["worker"]["runtime"]
        worker = container(workload(render(VALUE_SETS[name]), "worker")["spec"]["template"]["spec"], "worker")
        assert worker["image"] == images.engine_image(runtime).reference, name
