"""`--bundle-dir`: manifest.json -> target, draft, dtype; other runtimes' formats and broken dirs are refused."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import tritonclient.grpc as triton

from service.worker.bundle import BundleError, BundleManifest, read_bundle
from service.worker.settings import WorkerSettings
from tests.service.conftest import REPO, Worker, output


def bundle_at(tmp_path, manifest: dict | str, *subdirs: str):
    d = tmp_path / "bundle"
    d.mkdir()
    (d / "manifest.json").write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    for sub in subdirs:
        (d / sub).mkdir(parents=True)
    return d


def test_a_pytorch_bundle_resolves_paths_against_the_dir(tmp_path):
    d = bundle_at(
        tmp_path, {"format": "pytorch", "target": "target", "draft": "draft", "dtype": "bfloat16"}, "target", "draft"
    )
    assert read_bundle(d) == BundleManifest("pytorch", str(d / "target"), str(d / "draft"), "bfloat16")


def test_aliases_keywords_and_absolute_paths_pass_through(tmp_path):
    elsewhere = tmp_path / "drafts" / "eagle3"
    elsewhere.mkdir(parents=True)
    d = bundle_at(tmp_path, {"format": "deepspec", "target": "smollm2-135m", "draft": str(elsewhere)})
    m = read_bundle(d)
    assert (m.target, m.draft, m.dtype) == ("smollm2-135m", str(elsewhere), "float32")  # dtype defaults to float32
    for draft in ("none", "prompt-lookup", "auto"):
        (d / "manifest.json").write_text(json.dumps({"format": "pytorch", "target": "stub", "draft": draft}))
        assert read_bundle(d).draft == draft


@pytest.mark.parametrize(
    "fmt, says",
    [
        ("vllm", "vllm serve"),
        ("sglang", "launch/sglang.sh"),
        ("tensorrt-llm", "worker.runtime=triton"),
        ("triton-repo", "tritonserver"),
    ],
)
def test_bundles_for_other_runtimes_are_refused_with_the_way_out(tmp_path, fmt, says):
    d = bundle_at(tmp_path, {"format": fmt, "target": "smollm2-135m", "draft": "none", "dtype": "float32"})
    with pytest.raises(BundleError, match=says):
        read_bundle(d)


@pytest.mark.parametrize(
    "manifest, says",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ({"target": "stub"}, "missing or empty format"),
        ({"format": "pytorch", "target": ""}, "missing or empty target"),
        ({"format": "gguf", "target": "stub"}, r"unknown format 'gguf' \(known: pytorch, deepspec, onnx"),
        ({"format": "pytorch", "target": "stub", "dtype": "float16"}, "dtype 'float16'"),
        ({"format": "pytorch", "target": "stub", "draft": 3}, "draft must be"),
        ({"format": "pytorch", "target": "stub", "draft": "draft"}, "draft 'draft' does not exist"),
        ({"format": "pytorch", "target": "./weights"}, "target './weights' does not exist"),
        ({"format": "pytorch", "target": "/nowhere/model.gguf"}, "does not exist"),
    ],
)
def test_malformed_manifests_name_the_problem(tmp_path, manifest, says):
    with pytest.raises(BundleError, match=says):
        read_bundle(bundle_at(tmp_path, manifest))


def test_missing_dir_or_manifest(tmp_path):
    with pytest.raises(BundleError, match="no such directory"):
        read_bundle(tmp_path / "absent")
    with pytest.raises(BundleError, match="no manifest.json"):
        read_bundle(tmp_path)


def test_flags_win_over_the_manifest(tmp_path):
    d = bundle_at(
        tmp_path, {"format": "pytorch", "target": "target", "draft": "prompt-lookup", "dtype": "bfloat16"}, "target"
    )
    s = WorkerSettings(bundle_dir=d)
    assert (s.target, s.draft, s.dtype) == (str(d / "target"), "prompt-lookup", "bfloat16")
    s = WorkerSettings(bundle_dir=d, draft="none", dtype="float32")
    assert (s.target, s.draft, s.dtype) == (str(d / "target"), "none", "float32")
    assert WorkerSettings().target == "smollm2-135m"  # no bundle: the defaults


def test_cli_exits_non_zero_with_the_reason(tmp_path):
    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "service", "worker", *args], cwd=REPO, capture_output=True, text=True, timeout=60
        )

    out = run("--bundle-dir", str(tmp_path / "absent"))
    assert out.returncode == 2 and "--bundle-dir" in out.stderr and "no such directory" in out.stderr
    d = bundle_at(tmp_path, {"format": "tensorrt-llm", "target": "smollm2-135m"})
    out = run("--bundle-dir", str(d))
    assert out.returncode == 2 and "TensorRT-LLM engine" in out.stderr and "worker.runtime=triton" in out.stderr


@pytest.mark.integration
def test_worker_serves_what_the_manifest_names(tmp_path):
    d = bundle_at(tmp_path, {"format": "pytorch", "target": "stub", "draft": "none", "dtype": "float32"})
    worker = Worker(tmp_path, "--bundle-dir", str(d))
    i = worker.args.index("--target")
    del worker.args[i : i + 2]  # the manifest names the target
    worker.start().wait_ready()
    try:
        client = triton.InferenceServerClient(worker.address)
        t = triton.InferInput("text_input", [1, 1], "BYTES")
        t.set_data_from_numpy(np.array([[b"Hello"]], dtype=object))
        result = client.infer("stub", [t])
        assert output(result, "num_output_tokens")[0][0] > 0
        assert output(result, "num_draft_tokens")[0][0] == 0  # draft "none": the target-only baseline
        client.close()
    finally:
        worker.terminate()
