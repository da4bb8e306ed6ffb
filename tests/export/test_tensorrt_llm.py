"""--format tensorrt-llm: the checkpoint maps back to every Hugging Face tensor bit for bit, shards concatenate to
the whole, the serve YAML names the draft, and --build says what is missing here."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from safetensors.torch import load_file

from export.trtllm_checkpoint import to_hf
from tests.export.conftest import run_export


def _export(tmp_path, target, *extra):
    out = tmp_path / "trt"
    result = run_export("--target", target, "--format", "tensorrt-llm", "--dtype", "float32", "--out", out, *extra)
    assert result.returncode == 0, result.stderr
    return out


def _arch(target_dir):
    from transformers import AutoConfig

    from deepspec.models.arch import arch_spec_from_config

    return arch_spec_from_config(AutoConfig.from_pretrained(target_dir))


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("tp", [1, 2, 4])  # 4 ranks > 2 key/value heads: K/V duplicated
def test_checkpoint_maps_back_to_every_target_tensor_bit_for_bit(tmp_path, targets, family, tp):
    out = _export(tmp_path, targets[family], "--tp", tp, "--draft", "none")
    config = json.loads((out / "checkpoint" / "config.json").read_text())
    assert config["mapping"] == {"world_size": tp, "tp_size": tp, "pp_size": 1}
    assert config["architecture"] == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                                      "qwen3": "Qwen3ForCausalLM"}[family]
    ranks = [load_file(out / "checkpoint" / f"rank{r}.safetensors") for r in range(tp)]
    hf = load_file(targets[family] / "model.safetensors")
    back = to_hf(ranks, _arch(targets[family]))
    assert set(back) == set(hf)
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


def test_tp2_shards_concatenate_to_the_whole(tmp_path, targets):
    whole = load_file(_export(tmp_path / "1", targets["llama"], "--draft", "none") / "checkpoint" / "rank0.safetensors")
    out = _export(tmp_path / "2", targets["llama"], "--draft", "none", "--tp", "2")
    r0, r1 = (load_file(out / "checkpoint" / f"rank{r}.safetensors") for r in range(2))
    layer = "transformer.layers.3."
    for name, dim in [("mlp.fc.weight", 0), ("mlp.gate.weight", 0), ("mlp.proj.weight", 1),
                      ("attention.dense.weight", 1)]:
        assert torch.equal(torch.cat([r0[layer + name], r1[layer + name]], dim=dim), whole[layer + name])
    assert torch.equal(torch.cat([r0["lm_head.weight"], r1["lm_head.weight"]]), whole["lm_head.weight"])
    # qkv: each rank holds [q_r; k_r; v_r]; the whole is [q; k; v]
    q, kv = 4 * 8 // 2, 2 * 8 // 2
    parts = [r[layer + "attention.qkv.weight"].split([q, kv, kv]) for r in (r0, r1)]
    assert torch.equal(torch.cat([torch.cat([p[i] for p in parts]) for i in range(3)]),
                       whole[layer + "attention.qkv.weight"])
    assert torch.equal(r0["transformer.vocab_embedding.weight"], whole["transformer.vocab_embedding.weight"])


def test_mlp_swap_is_tensorrt_llms(tmp_path, targets):
    ranks = load_file(_export(tmp_path, targets["llama"], "--draft", "none") / "checkpoint" / "rank0.safetensors")
    hf = load_file(targets["llama"] / "model.safetensors")
    assert torch.equal(ranks["transformer.layers.0.mlp.fc.weight"], hf["model.layers.0.mlp.gate_proj.weight"])
    assert torch.equal(ranks["transformer.layers.0.mlp.gate.weight"], hf["model.layers.0.mlp.up_proj.weight"])


def test_draft_serve_yaml_and_build_script(tmp_path, targets, drafts):
    out = _export(tmp_path, targets["llama"], "--draft", drafts["llama", "eagle3"], "--num-speculative-tokens", "4")
    serve = yaml.safe_load((out / "trtllm-serve.yaml").read_text())
    assert serve["backend"] == "pytorch"
    assert serve["speculative_config"] == {"decoding_type": "Eagle3", "max_draft_len": 4, "speculative_model": "draft",
                                           "eagle3_one_model": True}
    draft = json.loads((out / "draft" / "config.json").read_text())
    assert draft["eagle_config"]["eagle3_layers_to_capture"] == [1, 2, 3]  # "output of layer" = our feature layers
    assert "midlayer.self_attn.q_proj.weight" in load_file(out / "draft" / "model.safetensors")
    build = (out / "build.sh").read_text()
    assert "--speculative_decoding_mode draft_tokens_external --max_draft_len 4" in build
    assert "import plugins.tensorrt" in build and "python -m plugins build" in build
    assert "deepspec::greedy_accept" in build and "deepspec::rejection_sample" in build
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["engine_layer_ids"] == {"tensorrt-llm": [1, 2, 3]} and manifest["captured_layers_hs"] == [2, 3, 4]


def test_build_without_tensorrt_llm_names_what_is_missing(tmp_path, targets):
    out = tmp_path / "trt"
    result = run_export("--target", targets["llama"], "--draft", "none", "--format", "tensorrt-llm", "--build",
                        "--out", out)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "tensorrt_llm is not installed" in result.stderr and "no CUDA GPU" in result.stderr
    assert "sh OUT/build.sh" in result.stderr and not out.exists()


@pytest.mark.parametrize("family, says", [("gemma3_text", "cannot take a gemma3_text target")])
def test_a_family_tensorrt_llm_cannot_take_is_refused(tmp_path, targets, family, says):
    result = run_export("--target", targets[family], "--draft", "none", "--format", "tensorrt-llm",
                        "--out", tmp_path / "o")
    assert result.returncode == 2 and says in result.stderr and not (tmp_path / "o").exists()


def test_tp_that_does_not_divide_the_heads_is_refused(tmp_path, targets):
    result = run_export("--target", targets["llama"], "--draft", "none", "--format", "tensorrt-llm", "--tp", "3",
                        "--out", tmp_path / "o")
    assert result.returncode == 2 and "--tp 3 must divide the 4 attention heads" in result.stderr


def test_qwen3_eagle3_draft_with_qk_norm_is_refused(tmp_path, targets, drafts):
    result = run_export("--target", targets["qwen3"], "--draft", drafts["qwen3", "eagle3"], "--format",
                        "tensorrt-llm", "--out", tmp_path / "o")
    assert result.returncode == 2 and "tensorrt-llm cannot load" in result.stderr and "q/k-norm" in result.stderr


def test_build_runs_build_sh_where_the_toolchain_is_present(tmp_path, targets, monkeypatch):
    """Where tensorrt_llm and a GPU exist, --build runs the written build.sh in the output (faked here: the script
    stands in for trtllm-build) and the manifest names the engine directory."""
    from export.formats import tensorrt_llm

    monkeypatch.setattr(tensorrt_llm, "build_blockers", lambda: [])
    monkeypatch.setattr(tensorrt_llm, "build_script",
                        lambda job: "#!/bin/sh\nset -e\ntest -f checkpoint/rank0.safetensors\nmkdir engine\n")
    out = _export(tmp_path, targets["llama"], "--draft", "none", "--build")
    assert (out / "engine").is_dir()
    assert json.loads((out / "manifest.json").read_text())["engine_dir"] == "engine"
    monkeypatch.setattr(tensorrt_llm, "build_script", lambda job: "#!/bin/sh\necho no GPU after all >&2\nexit 3\n")
    result = run_export("--target", targets["llama"], "--draft", "none", "--format", "tensorrt-llm", "--build",
                        "--out", tmp_path / "failed")
    assert result.returncode == 2 and "build.sh failed (3): no GPU after all" in result.stderr
    assert not (tmp_path / "failed").exists()
