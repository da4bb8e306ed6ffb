"""python -m export: the manifest, the pytorch format the worker reads, and every bad input as one line + exit 2
with nothing left behind."""

from __future__ import annotations

import json
import shutil

import pytest

from export.manifest import sha256_file, verify_files
from service.worker.bundle import read_bundle
from tests.export.conftest import run_export, run_export_process


def _fails(result, *says):
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m export: error: "), result.stderr
    for text in says:
        assert text in lines[0]


def _nothing_written(parent, name="out"):
    assert not (parent / name).exists()
    assert not [p for p in parent.iterdir() if p.name.startswith(f".{name}.")]  # no scratch dir left


def test_help_names_every_format_and_its_engine():
    result = run_export_process("--help", timeout=60)
    assert result.returncode == 0
    for fmt, engine in [
        ("pytorch", "DeepSpec"),
        ("vllm", "vLLM"),
        ("sglang", "SGLang"),
        ("tensorrt-llm", "TensorRT-LLM"),
        ("triton-repo", "Triton"),
        ("onnx", "ONNX Runtime"),
    ]:
        assert any(line.strip().startswith(fmt) and engine in line for line in result.stdout.splitlines()), fmt
    for flag in (
        "--target",
        "--draft",
        "--format",
        "--out",
        "--force",
        "--dtype",
        "--tp",
        "--build",
        "--num-speculative-tokens",
        "--chat-template",
    ):
        assert flag in result.stdout


def test_pytorch_export_is_what_the_worker_reads(tmp_path, targets, drafts):
    out = tmp_path / "engine"
    result = run_export(
        "--target", targets["llama"], "--draft", drafts["llama", "eagle3"], "--format", "pytorch", "--out", out
    )
    assert result.returncode == 0, result.stderr
    assert "exported pytorch (eagle3)" in result.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "pytorch" and manifest["draft"] == "draft" and manifest["algorithm"] == "eagle3"
    assert manifest["target"] == str(targets["llama"]) and manifest["dtype"] == "bfloat16"
    assert manifest["captured_layers_hs"] == [2, 3, 4]
    assert {"torch", "transformers", "deepspec"} <= set(manifest["tools"])
    from deepspec.models import load_target

    assert manifest["target_fingerprint"] == load_target(str(targets["llama"])).fingerprint()
    for rel, entry in manifest["files"].items():
        assert sha256_file(out / rel) == entry["sha256"]
    assert set(manifest["files"]) == {f"draft/{p.name}" for p in drafts["llama", "eagle3"].iterdir()}
    engine = read_bundle(out)
    assert (engine.format, engine.target, engine.draft, engine.dtype) == (
        "pytorch",
        str(targets["llama"]),
        str(out / "draft"),
        "bfloat16",
    )
    (out / "draft" / "config.json").write_text("{}")
    assert verify_files(out) == ["draft/config.json"]


def test_pytorch_export_of_a_worker_drafter_keeps_the_keyword(tmp_path, targets):
    result = run_export(
        "--target",
        targets["llama"],
        "--draft",
        "prompt-lookup",
        "--format",
        "pytorch",
        "--dtype",
        "float32",
        "--out",
        tmp_path / "e",
    )
    assert result.returncode == 0, result.stderr
    assert read_bundle(tmp_path / "e").draft == "prompt-lookup"


def test_unknown_format(tmp_path, targets):
    _fails(
        run_export("--target", targets["llama"], "--format", "gguf", "--out", tmp_path / "out"),
        "unknown format 'gguf'",
        "available: pytorch, vllm, sglang, tensorrt-llm, triton-repo",
    )
    _nothing_written(tmp_path)


def test_draft_trained_for_another_target(tmp_path, targets, drafts):
    _fails(
        run_export(
            "--target",
            targets["llama"],
            "--draft",
            drafts["qwen3", "eagle3"],
            "--format",
            "vllm",
            "--out",
            tmp_path / "out",
        ),
        "does not match target",
        "architecture: draft was trained on 'qwen3'",
    )
    _nothing_written(tmp_path)


def test_missing_draft_files(tmp_path, targets, drafts):
    _fails(
        run_export(
            "--target", targets["llama"], "--draft", tmp_path / "nowhere", "--format", "vllm", "--out", tmp_path / "out"
        ),
        "no such directory",
    )
    broken = tmp_path / "broken"
    shutil.copytree(drafts["llama", "eagle3"], broken)
    (broken / "model.safetensors").unlink()
    _fails(
        run_export("--target", targets["llama"], "--draft", broken, "--format", "sglang", "--out", tmp_path / "out"),
        "model.safetensors is missing",
    )
    (broken / "config.json").unlink()
    _fails(
        run_export("--target", targets["llama"], "--draft", broken, "--format", "pytorch", "--out", tmp_path / "out"),
        "config.json is missing",
    )
    _nothing_written(tmp_path)


def test_existing_non_empty_out_needs_force(tmp_path, targets, drafts):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    args = ("--target", targets["llama"], "--draft", drafts["llama", "eagle3"], "--format", "vllm", "--out", out)
    _fails(run_export(*args), "exists and is not empty", "--force")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert run_export(*args, "--force").returncode == 0
    assert not (out / "keep.txt").exists() and (out / "manifest.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # the replaced copy and the scratch dir are gone


def test_format_the_target_family_cannot_take(tmp_path, targets):
    _fails(
        run_export(
            "--target", targets["gemma3_text"], "--draft", "none", "--format", "triton-repo", "--out", tmp_path / "out"
        ),
        "cannot take a gemma3_text target",
    )
    _nothing_written(tmp_path)


def test_corpus_index_goes_to_the_worker_only(tmp_path, targets):
    from deepspec.models import load_target

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    fingerprint = load_target(str(targets["llama"])).fingerprint()
    (corpus / "config.json").write_text(json.dumps({"algo": "corpus-lookup", "max_match": 4, "target": fingerprint}))
    (corpus / "corpus.safetensors").write_bytes(b"")
    _fails(
        run_export(
            "--target", targets["llama"], "--draft", tmp_path / "corpus", "--format", "vllm", "--out", tmp_path / "out"
        ),
        "corpus-lookup index",
        "--format pytorch",
    )
    _nothing_written(tmp_path)


def test_neural_formats_need_a_draft(tmp_path, targets):
    _fails(
        run_export("--target", targets["llama"], "--draft", "none", "--format", "sglang", "--out", tmp_path / "out"),
        "leaves nothing to export",
    )


def test_dtype_the_worker_cannot_load(tmp_path, targets):
    _fails(
        run_export(
            "--target",
            targets["llama"],
            "--draft",
            "none",
            "--format",
            "pytorch",
            "--dtype",
            "float16",
            "--out",
            tmp_path / "out",
        ),
        "writes bfloat16, float32, not --dtype float16",
    )


def test_a_failure_while_writing_leaves_nothing(tmp_path, targets, drafts, monkeypatch):
    from export.formats import vllm

    def explode(job, out, progress):
        (out / "half.bin").write_bytes(b"x" * 10)
        raise RuntimeError("disk full")

    monkeypatch.setattr(vllm, "FORMAT", vllm.FORMAT.__class__(**{**vllm.FORMAT.__dict__, "write": explode}))
    with pytest.raises(RuntimeError, match="disk full"):
        run_export(
            "--target",
            targets["llama"],
            "--draft",
            drafts["llama", "eagle3"],
            "--format",
            "vllm",
            "--out",
            tmp_path / "out",
        )
    _nothing_written(tmp_path)


@pytest.mark.parametrize(
    "fmt, says", [("vllm", "vllm serve"), ("sglang", "launch/sglang.sh"), ("tensorrt-llm", "worker.runtime=triton")]
)
def test_the_worker_refuses_other_engines_exports_with_the_way_out(tmp_path, targets, drafts, fmt, says):
    from service.worker.bundle import BundleError

    out = tmp_path / "out"
    assert (
        run_export(
            "--target", targets["llama"], "--draft", drafts["llama", "eagle3"], "--format", fmt, "--out", out
        ).returncode
        == 0
    )
    with pytest.raises(BundleError, match=says):
        read_bundle(out)


def test_auto_without_a_fitting_shipped_draft(tmp_path, targets, drafts, monkeypatch):
    """A target-only engine degrades loudly to the target alone; a draft-only format refuses."""
    import deepspec.models.drafts as shipped

    five = tmp_path / "five"
    from tests.export.conftest import write_draft

    write_draft(five, targets["llama"], "eagle3", feature_layers=(0, 1, 2, 3, 4))
    monkeypatch.setattr(shipped, "shipped_drafts", lambda target, root=None: [(five, 2.0)])
    result = run_export("--target", targets["llama"], "--format", "tensorrt-llm", "--out", tmp_path / "trt")
    assert result.returncode == 0, result.stderr
    assert "warning: --draft auto: no shipped draft" in result.stderr and "captures 5" in result.stderr
    manifest = json.loads((tmp_path / "trt" / "manifest.json").read_text())
    assert manifest["draft"] == "none" and manifest["algorithm"] is None and manifest["warnings"]
    _fails(
        run_export("--target", targets["llama"], "--format", "sglang", "--out", tmp_path / "out"),
        "--draft auto: no shipped draft",
        "captures 5",
    )
    # vLLM's EAGLE-3 fc takes 3 captured layers too (tests/export/test_draft_formats.py): refused there as well
    _fails(
        run_export("--target", targets["llama"], "--format", "vllm", "--out", tmp_path / "vllm"),
        "--draft auto: no shipped draft",
        "captures 5",
    )


def test_a_target_the_onnx_graph_cannot_describe_is_one_line(tmp_path, targets):
    """head_dim 8: ONNX Runtime's GroupQueryAttention refuses it; the export says so before writing anything."""
    _fails(
        run_export("--target", targets["llama"], "--draft", "none", "--format", "onnx", "--out", tmp_path / "out"),
        "onnx cannot take",
        "head_dim % 16 == 0 (this target: 8)",
    )
    _nothing_written(tmp_path)


def test_every_format_has_its_help_line_and_no_line_lacks_a_format():
    """export/registry.py: adding a format is an entry in FORMAT_MODULES and its --help line in FORMAT_RUNTIMES."""
    from export.registry import FORMAT_MODULES, FORMAT_RUNTIMES

    assert list(FORMAT_RUNTIMES) == list(FORMAT_MODULES)
