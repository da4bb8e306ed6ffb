"""`python -m export --chat-template`: the chosen template travels with the export, so the engine renders chat
with it. Formats that copy the target's tokenizer files (triton-repo, onnx) carry it in those files, where
transformers — and so TensorRT-LLM's LLM API and our ONNX worker — reads it; the others write it beside
manifest.json and say the engine must be given it. A target that ships none still exports, with the refusal's
one line as a warning."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from deepspec.models.chat_templates import BUILTIN_CHAT_TEMPLATES
from export.manifest import sha256_file
from tests.export.conftest import run_export, write_hf_target

MESSAGES = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """A llama-family target named `bare` whose tokenizer ships no chat template."""
    return write_hf_target(tmp_path_factory.mktemp("chat") / "bare", "llama", chat_template=None)


def test_triton_repo_tokenizer_carries_the_template(tmp_path, bare):
    """The LLM-API model renders `messages_json` with `llm.tokenizer.apply_chat_template`, i.e. the tokenizer
    loaded from tensorrt_llm/1/target/: that directory's files must hold the template."""
    out = tmp_path / "triton"
    result = run_export(
        "--target", bare, "--draft", "none", "--format", "triton-repo", "--chat-template", "qwen", "--out", out
    )
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr, result.stderr
    tokenizer_dir = out / "tensorrt_llm" / "1" / "target"
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    assert tokenizer.chat_template == BUILTIN_CHAT_TEMPLATES["qwen"]
    assert tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False).startswith(
        "<|im_start|>system\nYou are Qwen"
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["chat_template"] == "tensorrt_llm/1/target/chat_template.jinja"
    for rel in (manifest["chat_template"], "tensorrt_llm/1/target/tokenizer_config.json"):
        assert manifest["files"][rel]["sha256"] == sha256_file(out / rel)


def test_onnx_export_is_served_with_the_template(tmp_path):
    """The ONNX worker's target reads its tokenizer from the export directory (load_onnx_target)."""
    pytest.importorskip("onnxruntime")
    from transformers import PreTrainedTokenizerBase

    from deepspec.models.onnx_target import load_onnx_target

    target_dir = write_hf_target(tmp_path / "bare16", "llama", chat_template=None, hidden_size=64, head_dim=16)
    out = tmp_path / "onnx"
    result = run_export(
        "--target", target_dir, "--draft", "none", "--format", "onnx", "--chat-template", "gemma3", "--out", out
    )
    assert result.returncode == 0, result.stderr
    assert json.loads((out / "manifest.json").read_text())["chat_template"] == "chat_template.jinja"
    target = load_onnx_target(str(out))
    assert isinstance(target.tokenizer, PreTrainedTokenizerBase)
    assert target.tokenizer.chat_template == BUILTIN_CHAT_TEMPLATES["gemma3"]
    assert target.encode_chat(MESSAGES)


def test_a_format_serving_the_targets_own_tokenizer_writes_it_beside_the_manifest(tmp_path, bare):
    out = tmp_path / "engine"
    result = run_export(
        "--target", bare, "--draft", "prompt-lookup", "--format", "pytorch", "--chat-template", "gemma3", "--out", out
    )
    assert result.returncode == 0, result.stderr
    assert (out / "chat_template.jinja").read_text() == BUILTIN_CHAT_TEMPLATES["gemma3"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["chat_template"] == "chat_template.jinja" and "chat_template.jinja" in manifest["files"]
    # the worker's --bundle-dir takes it from the manifest: nothing left for the user to pass
    assert "warning" not in result.stderr and "warnings" not in manifest
    from service.worker.bundle import read_bundle

    fields = read_bundle(out).worker_fields()
    assert fields["chat_template"] == str((out / "chat_template.jinja").resolve())


def test_vllm_and_sglang_launch_commands_pass_the_exported_template():
    """vllm serve and SGLang's launch_server take `--chat-template FILE` (vllm/entrypoints/openai/cli_args.py,
    sglang/srt/server_args.py); the launch scripts run from the export directory, where the template is."""
    from types import SimpleNamespace

    from export.snippets import sglang_command, vllm_command

    job = SimpleNamespace(
        draft=SimpleNamespace(algo="eagle3"),
        target=SimpleNamespace(path="/m"),
        tp=1,
        dtype="bfloat16",
        num_speculative_tokens=3,
        options={"chat_template": "{{ x }}"},
    )
    for command in (vllm_command(job, "draft"), sglang_command(job, "draft")):
        assert command.endswith(" --chat-template chat_template.jinja")
    job.options = {}
    assert "--chat-template" not in vllm_command(job, "draft") + sglang_command(job, "draft")


def test_a_target_without_a_template_exports_with_the_refusal_as_a_warning(tmp_path, bare):
    """Completions need no template, so the export goes ahead; the line is the one training and the worker
    give."""
    result = run_export("--target", bare, "--draft", "prompt-lookup", "--format", "pytorch", "--out", tmp_path / "e")
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == (
        f"python -m export: warning: target {bare} ships no chat template; pass --chat-template with a built-in "
        "(smollm2, qwen, gemma3) or a Jinja file; until then its engine refuses chat requests"
    )
    assert "chat_template" not in json.loads((tmp_path / "e" / "manifest.json").read_text())


def test_an_unknown_template_is_refused_before_anything_is_written(tmp_path, bare):
    result = run_export("--target", bare, "--format", "pytorch", "--chat-template", "nope", "--out", tmp_path / "out")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "python -m export: error: --chat-template 'nope' is neither a built-in (smollm2, qwen, gemma3) nor a file"
    )
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))
