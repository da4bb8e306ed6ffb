"""`python -m export --format F --out DIR` with every other flag at its default succeeds for every registered format,
and `--draft auto` gives each format the best shipped draft it can take.

The in-process runs swap the default alias's weights and the shipped `drafts/` folder for tiny copies of the same
lineup (a hybrid, a corpus index, DFlash, the 5-layer Eagle3 and the canonical 3-layer Eagle3, each with an eval.json
whose order mirrors the real one), so each export takes milliseconds and the whole write path runs. The slow test
resolves the real default target against the real `drafts/` for every format.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from export.registry import available_formats
from tests.export.conftest import run_export, write_draft, write_hf_target

#: --format -> what auto must pick from the tiny lineup below: the best-scoring draft the format takes
EXPECTED = {
    "pytorch": "hybrid",
    "onnx": "corpus",
    "vllm": "dflash",
    "sglang": "dflash",
    "tensorrt-llm": "eagle3-canonical",
    "triton-repo": "eagle3-canonical",
}


def _eval(path: Path, tau: float, speedup: float) -> None:
    results = [
        {"dataset": name, "temperature": 0.0, "acceptance_length": tau, "speedup": speedup}
        for name in ("humaneval", "gsm8k", "mbpp")
    ]
    (path / "eval.json").write_text(json.dumps({"results": results}))


@pytest.fixture(scope="module")
def default_target(tmp_path_factory) -> Path:
    """A tiny Llama in the default target's family, head_dim 16 (what ONNX Runtime's attention takes)."""
    return write_hf_target(tmp_path_factory.mktemp("default-target") / "llama", "llama", hidden_size=64, head_dim=16)


@pytest.fixture(scope="module")
def lineup(tmp_path_factory, default_target) -> Path:
    """A drafts/ folder for the tiny default target with the shipped kinds of draft, best-scoring first."""
    from deepspec.decoding.drafters.corpus_lookup import save_corpus
    from deepspec.decoding.drafters.hybrid import save_hybrid
    from deepspec.decoding.drafters.suffix_index import SuffixIndex
    from deepspec.models import load_target

    root, target_dir = tmp_path_factory.mktemp("shipped"), default_target
    fingerprint = load_target(str(target_dir)).fingerprint()
    tokens = np.random.default_rng(0).integers(3, 128, size=512).astype(np.int64)
    save_corpus(root / "corpus", SuffixIndex.build(tokens, max_match=8), fingerprint)
    write_draft(root / "dflash", target_dir, "dflash")
    write_draft(root / "eagle3", target_dir, "eagle3", feature_layers=(0, 1, 2, 3, 4))  # 5 layers: no engine
    write_draft(root / "eagle3-canonical", target_dir, "eagle3", layout="canonical", feature_layers=(1, 2, 3))
    save_hybrid(root / "hybrid", root / "corpus", root / "eagle3")
    for name, tau, speedup in [
        ("hybrid", 3.0, 1.4),
        ("corpus", 2.3, 1.5),
        ("dflash", 1.6, 0.9),
        ("eagle3", 1.55, 0.8),
        ("eagle3-canonical", 1.5, 0.8),
    ]:
        _eval(root / name, tau, speedup)
    return root


@pytest.fixture()
def defaults(monkeypatch, default_target, lineup):
    """The default alias resolves to the tiny target; the shipped drafts are the tiny lineup."""
    import deepspec.models.drafts as shipped
    import deepspec.models.target_loader as loader

    monkeypatch.setattr(loader, "_materialize_gguf", lambda gguf: default_target)
    monkeypatch.setattr(shipped, "shipped_drafts_dir", lambda: lineup)
    return lineup


@pytest.mark.parametrize("fmt", available_formats())
def test_every_format_exports_from_the_default_command(tmp_path, defaults, fmt):
    out = tmp_path / "out"
    result = run_export("--format", fmt, "--out", out)
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["target"] == "smollm2-135m" and manifest["format"] == fmt
    assert Path(manifest["draft_source"]) == (defaults / EXPECTED[fmt]).resolve()


def test_the_pytorch_copy_of_a_hybrid_is_what_the_worker_loads(tmp_path, defaults, default_target):
    """The hybrid names its parts by `../` paths; the export puts them inside its copy, which the worker's drafter
    registry loads as the same corpus + Eagle3 pair."""
    from deepspec.decoding import build_drafter
    from deepspec.models import load_target

    out = tmp_path / "engine"
    assert run_export("--format", "pytorch", "--out", out).returncode == 0
    config = json.loads((out / "draft" / "config.json").read_text())
    assert (config["algo"], config["corpus"], config["neural"]) == ("hybrid", "corpus", "neural")
    assert (out / "draft" / "corpus" / "corpus.safetensors").is_file()
    assert (out / "draft" / "neural" / "model.safetensors").is_file()
    drafter = build_drafter(str(out / "draft"), load_target(str(default_target)))
    assert type(drafter).__name__ == "HybridDrafter"
    files = json.loads((out / "manifest.json").read_text())["files"]
    assert {"draft/config.json", "draft/corpus/config.json", "draft/neural/config.json"} <= set(files)


def test_without_a_canonical_eagle3_each_engine_says_why_each_draft_does_not_fit(tmp_path, defaults):
    """Today's shipped set (no canonical Eagle3): TensorRT-LLM exports the target alone with a warning that names
    the real reason for every draft (never the draft reader's "unknown keys" message for the hybrid)."""
    import shutil

    shutil.move(defaults / "eagle3-canonical", tmp_path / "aside")
    try:
        result = run_export("--format", "tensorrt-llm", "--out", tmp_path / "trt")
    finally:
        shutil.move(tmp_path / "aside", defaults / "eagle3-canonical")
    assert result.returncode == 0, result.stderr
    warning = result.stderr
    assert "warning: --draft auto: no shipped draft" in warning and "exporting the target alone" in warning
    assert "hybrid: tensorrt-llm cannot load hybrid: a hybrid (corpus-lookup + an eagle3 draft)" in warning
    assert "corpus: tensorrt-llm cannot load corpus: a corpus-lookup index" in warning
    assert "dflash: tensorrt-llm cannot load dflash: DeepSpec exports dflash drafts for vllm, sglang" in warning
    assert "eagle3: tensorrt-llm cannot load" in warning and "captures 5" in warning
    assert "unknown keys" not in warning and "newer DeepSpec" not in warning


def test_an_explicit_hybrid_for_a_draft_only_engine_names_what_it_is(tmp_path, defaults):
    result = run_export("--draft", defaults / "hybrid", "--format", "vllm", "--out", tmp_path / "o")
    assert result.returncode == 2
    assert "is a hybrid (corpus-lookup + an eagle3 draft), which only DeepSpec's worker runs" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("fmt", available_formats())
def test_the_real_default_command_resolves_for_every_format(fmt):
    """The real default target against the real drafts/: every format gets a job (a draft it loads, or the target
    alone / prompt lookup where the engine allows), and what it picked is a format's own choice."""
    import argparse

    from export.cli import build_parser
    from export.registry import resolve_format
    from export.resolve import make_job

    args: argparse.Namespace = build_parser().parse_args(["--format", fmt, "--out", "unused"])
    job = make_job(resolve_format(fmt), args)
    if job.draft is not None:
        assert job.draft.path.parent.name == "drafts"
    else:
        assert job.draft_spec in ("none", "prompt-lookup")


def test_a_hybrid_whose_part_is_missing_names_it(tmp_path, defaults):
    import shutil

    lonely = tmp_path / "hybrid"
    lonely.mkdir()
    shutil.copy(defaults / "hybrid" / "config.json", lonely / "config.json")  # "../corpus" is not beside it here
    result = run_export("--draft", lonely, "--format", "pytorch", "--out", tmp_path / "o")
    assert result.returncode == 2 and "corpus: no such directory" in result.stderr, result.stderr
