"""--format tensorrt-llm: the checkpoint maps back to every Hugging Face tensor bit for bit, shards concatenate to
the whole, the serve YAML names the draft, and --build says what is missing here."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from safetensors.torch import load_file

from export.trtllm_checkpoint import to_hf
from tests.export.conftest import run_export, write_draft


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
    assert (
        config["architecture"]
        == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[family]
    )
    ranks = [load_file(out / "checkpoint" / f"rank{r}.safetensors") for r in range(tp)]
    hf = load_file(targets[family] / "model.safetensors")
    back = to_hf(ranks, _arch(targets[family]))
    assert set(back) == set(hf)
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


#: What TensorRT-LLM assumes for a key config.json leaves out, per `architecture`, read from its config classes:
#: tensorrt_llm/models/modeling_utils.py `PretrainedConfig.__init__` (hidden_act 'gelu', norm_epsilon 1e-5,
#: position_embedding_type learned_absolute, qk_layernorm False, logits_dtype float32), plus
#: tensorrt_llm/models/llama/config.py `LLaMAConfig.__init__` (attn_bias False, mlp_bias False, rotary_base 10000.0,
#: rotary_scaling None, residual_mlp False, the *_multiplier 1.0) and tensorrt_llm/models/qwen/config.py
#: `QWenConfig.__init__` (attn_bias **True**, mlp_bias False, rotary_base 10000.0, rotary_scaling None,
#: use_logn_attn False). `PretrainedConfig.from_dict` picks the class by `architecture` (MODEL_MAP) and passes the
#: dict as keyword arguments, so these defaults are what a missing key becomes.
_BASE_DEFAULTS = {
    "hidden_act": "gelu",
    "norm_epsilon": 1e-5,
    "position_embedding_type": "learned_absolute",
    "qk_layernorm": False,
    "logits_dtype": "float32",
}
TRTLLM_DEFAULTS = {
    "LlamaForCausalLM": {
        **_BASE_DEFAULTS,
        "attn_bias": False,
        "mlp_bias": False,
        "rotary_base": 10000.0,
        "rotary_scaling": None,
        "residual_mlp": False,
        "embedding_multiplier": 1.0,
        "attention_multiplier": 1.0,
        "residual_multiplier": 1.0,
        "output_multiplier_scale": 1.0,
    },
    "Qwen2ForCausalLM": {
        **_BASE_DEFAULTS,
        "attn_bias": True,
        "mlp_bias": False,
        "rotary_base": 10000.0,
        "rotary_scaling": None,
        "use_logn_attn": False,
    },
}
TRTLLM_DEFAULTS["Qwen3ForCausalLM"] = TRTLLM_DEFAULTS["Qwen2ForCausalLM"]
#: attributes the model classes read that no config class defines (no default: an AttributeError at build time):
#: tensorrt_llm/models/qwen/model.py `QWenDecoderLayer.__init__` reads config.qwen_type and config.seq_length
TRTLLM_REQUIRED = {
    "LlamaForCausalLM": (),
    "Qwen2ForCausalLM": ("qwen_type", "seq_length"),
    "Qwen3ForCausalLM": ("qwen_type", "seq_length"),
}


def _what_the_target_needs(target_dir) -> dict:
    """The values TensorRT-LLM must see for this Hugging Face target, read from its config and weights."""
    hf_config = json.loads((target_dir / "config.json").read_text())
    hf = load_file(target_dir / "model.safetensors")
    return {
        "attn_bias": "model.layers.0.self_attn.q_proj.bias" in hf,
        "mlp_bias": "model.layers.0.mlp.gate_proj.bias" in hf,
        "rotary_base": float(hf_config.get("rope_theta") or hf_config["rope_parameters"]["rope_theta"]),
        "rotary_scaling": None,
        "hidden_act": hf_config["hidden_act"],
        "norm_epsilon": hf_config["rms_norm_eps"],
        "position_embedding_type": "rope_gpt_neox",
        "logits_dtype": "float32",
        "tie_word_embeddings": hf_config["tie_word_embeddings"],
    }


def _effective_qk_norm(config: dict) -> bool:
    """Whether the builder gives attention q/k-norm: the Qwen model derives it from qwen_type
    (tensorrt_llm/models/qwen/model.py `QWenDecoderLayer`: `qk_layernorm = config.qwen_type in ('qwen3',
    'qwen3_moe')`); Llama reads PretrainedConfig.qk_layernorm."""
    if config["architecture"].startswith("Qwen"):
        return config.get("qwen_type") in ("qwen3", "qwen3_moe")
    return bool(config.get("qk_layernorm", False))


def _tensors_the_builder_requires(config: dict) -> set[str]:
    """The parameter names `PretrainedModel.load` (tensorrt_llm/models/modeling_utils.py) requires of a rank file
    for this config: Attention(bias=attn_bias, qk_layernorm), GatedMLP(fc, gate, proj; bias=mlp_bias), RmsNorms,
    lm_head."""
    names = {"transformer.vocab_embedding.weight", "transformer.ln_f.weight", "lm_head.weight"}
    for i in range(config["num_hidden_layers"]):
        layer = f"transformer.layers.{i}."
        names |= {
            layer + n
            for n in (
                "input_layernorm.weight",
                "post_layernorm.weight",
                "attention.qkv.weight",
                "attention.dense.weight",
                "mlp.fc.weight",
                "mlp.gate.weight",
                "mlp.proj.weight",
            )
        }
        if config["attn_bias"]:
            names.add(layer + "attention.qkv.bias")
        if config["mlp_bias"]:
            names |= {layer + f"mlp.{n}.bias" for n in ("fc", "gate", "proj")}
        if _effective_qk_norm(config):
            names |= {layer + "attention.q_layernorm.weight", layer + "attention.k_layernorm.weight"}
    return names


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_every_key_whose_tensorrt_llm_default_is_wrong_for_the_target_is_written(tmp_path, targets, family):
    """config.json read the way TensorRT-LLM reads it (its class defaults under our keys) describes the target, and
    the rank file holds exactly the tensors that config makes the builder require."""
    out = _export(tmp_path, targets[family], "--draft", "none")
    ours = json.loads((out / "checkpoint" / "config.json").read_text())
    effective = {**TRTLLM_DEFAULTS[ours["architecture"]], **ours}
    for key, want in _what_the_target_needs(targets[family]).items():
        assert effective[key] == want, key
    assert _effective_qk_norm(effective) == (family == "qwen3")
    for key in TRTLLM_REQUIRED[ours["architecture"]]:
        assert key in ours, key
    if family in ("qwen2", "qwen3"):
        assert ours["qwen_type"] == family  # "qwen" would halve the MLP size (QWenDecoderLayer)
    rank0 = load_file(out / "checkpoint" / "rank0.safetensors")
    assert set(rank0) == _tensors_the_builder_requires(effective)


def test_a_config_without_attn_bias_makes_qwen3_ask_for_biases_it_lacks(tmp_path, targets):
    """Negative control of the check above: the QWenConfig default, applied to a Qwen3 config.json that leaves
    attn_bias out, requires attention.qkv.bias tensors the checkpoint does not hold."""
    out = _export(tmp_path, targets["qwen3"], "--draft", "none")
    ours = json.loads((out / "checkpoint" / "config.json").read_text())
    del ours["attn_bias"]
    missing = _tensors_the_builder_requires({**TRTLLM_DEFAULTS[ours["architecture"]], **ours}) - set(
        load_file(out / "checkpoint" / "rank0.safetensors")
    )
    assert missing and all(name.endswith("attention.qkv.bias") for name in missing)


def test_tp2_shards_concatenate_to_the_whole(tmp_path, targets):
    whole = load_file(_export(tmp_path / "1", targets["llama"], "--draft", "none") / "checkpoint" / "rank0.safetensors")
    out = _export(tmp_path / "2", targets["llama"], "--draft", "none", "--tp", "2")
    r0, r1 = (load_file(out / "checkpoint" / f"rank{r}.safetensors") for r in range(2))
    layer = "transformer.layers.3."
    for name, dim in [
        ("mlp.fc.weight", 0),
        ("mlp.gate.weight", 0),
        ("mlp.proj.weight", 1),
        ("attention.dense.weight", 1),
    ]:
        assert torch.equal(torch.cat([r0[layer + name], r1[layer + name]], dim=dim), whole[layer + name])
    assert torch.equal(torch.cat([r0["lm_head.weight"], r1["lm_head.weight"]]), whole["lm_head.weight"])
    # qkv: each rank holds [q_r; k_r; v_r]; the whole is [q; k; v]
    q, kv = 4 * 8 // 2, 2 * 8 // 2
    parts = [r[layer + "attention.qkv.weight"].split([q, kv, kv]) for r in (r0, r1)]
    assert torch.equal(
        torch.cat([torch.cat([p[i] for p in parts]) for i in range(3)]), whole[layer + "attention.qkv.weight"]
    )
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
    assert serve["speculative_config"] == {
        "decoding_type": "Eagle",
        "max_draft_len": 4,
        "speculative_model_dir": "draft",
        "eagle3_one_model": True,
        "allow_advanced_sampling": True,
        "eagle3_layers_to_capture": [1, 2, 3],
    }
    spec = trtllm_from_dict(serve["speculative_config"])
    assert spec.speculative_model == "draft" and spec.eagle3_layers_to_capture == {1, 2, 3}
    assert spec.spec_dec_mode == "EAGLE3_ONE_MODEL" and spec.allow_advanced_sampling
    draft = json.loads((out / "draft" / "config.json").read_text())
    assert draft["eagle_config"]["eagle3_layers_to_capture"] == [1, 2, 3]  # "output of layer" = our feature layers
    assert "midlayer.self_attn.q_proj.weight" in load_file(out / "draft" / "model.safetensors")
    build = (out / "build.sh").read_text()
    assert "--speculative_decoding_mode draft_tokens_external --max_draft_len 4" in build
    assert "import plugins.tensorrt" in build and "python -m plugins build" in build
    assert "deepspec::greedy_accept" in build and "deepspec::rejection_sample" in build
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["engine_layer_ids"] == {"tensorrt-llm": [1, 2, 3]} and manifest["captured_layers_hs"] == [2, 3, 4]


def _trtllm_eagle_config():
    """TensorRT-LLM 1.2.1's EAGLE config as its pydantic models declare it (tensorrt_llm/llmapi/llm_args.py at
    v1.2.1: `DecodingBaseConfig(StrictBaseModel)` — unknown keys are errors — `max_draft_len`,
    `speculative_model_dir`, `allow_advanced_sampling: bool = False`; `EagleDecodingConfig` `decoding_type:
    Literal["Eagle"]`, `eagle3_one_model: bool = True`, `eagle3_layers_to_capture: Optional[Set[int]] = None`, and
    `spec_dec_mode` EAGLE3_ONE_MODEL when eagle3_one_model). tensorrt_llm does not install here, so the model is
    rebuilt from those declarations; `from_dict`'s dispatch set is export/trtllm_releases.py's row."""
    from typing import Literal

    from pydantic import BaseModel, ConfigDict

    class EagleDecodingConfig(BaseModel):
        model_config = ConfigDict(extra="forbid")
        decoding_type: Literal["Eagle"] = "Eagle"
        max_draft_len: int | None = None
        speculative_model_dir: str | None = None
        allow_advanced_sampling: bool = False
        eagle3_one_model: bool | None = True
        eagle3_layers_to_capture: set[int] | None = None

        @property
        def speculative_model(self):
            return self.speculative_model_dir

        @property
        def spec_dec_mode(self) -> str:
            return "EAGLE3_ONE_MODEL" if self.eagle3_one_model else "EAGLE3"

    return EagleDecodingConfig


def trtllm_from_dict(spec: dict):
    """`DecodingBaseConfig.from_dict` of the pinned release: the dispatch set, then the class's strict fields."""
    from export.trtllm_releases import release

    if spec.get("decoding_type") not in release().decoding_types:
        raise ValueError(f"Invalid decoding type: {spec.get('decoding_type')}")
    return TensorRTLLMEagleConfig.model_validate(spec)


TensorRTLLMEagleConfig = _trtllm_eagle_config()


def test_serve_yaml_carries_non_default_captured_layers(tmp_path, targets):
    """A draft trained on other layers than TensorRT-LLM's default {1, L//2-1, L-4} must say so in the YAML: the
    engine reads the layers from `eagle3_layers_to_capture` only (_torch/speculative/eagle3.py
    `Eagle3OneModelSpecMetadata.__post_init__`), and a missing key silently captures the defaults."""
    draft = write_draft(tmp_path / "d", targets["llama"], "eagle3", layout="canonical", feature_layers=(0, 2, 4))
    out = _export(tmp_path, targets["llama"], "--draft", draft)
    spec = trtllm_from_dict(yaml.safe_load((out / "trtllm-serve.yaml").read_text())["speculative_config"])
    assert spec.eagle3_layers_to_capture == {0, 2, 4} != {1, 6 // 2 - 1, 6 - 4}
    assert spec.speculative_model == "draft" and spec.max_draft_len == 3


def test_build_without_tensorrt_llm_names_what_is_missing(tmp_path, targets):
    out = tmp_path / "trt"
    result = run_export(
        "--target", targets["llama"], "--draft", "none", "--format", "tensorrt-llm", "--build", "--out", out
    )
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "tensorrt_llm is not installed" in result.stderr and "no CUDA GPU" in result.stderr
    assert "sh OUT/build.sh" in result.stderr and not out.exists()


@pytest.mark.parametrize("family, says", [("gemma3_text", "cannot take a gemma3_text target")])
def test_a_family_tensorrt_llm_cannot_take_is_refused(tmp_path, targets, family, says):
    result = run_export(
        "--target", targets[family], "--draft", "none", "--format", "tensorrt-llm", "--out", tmp_path / "o"
    )
    assert result.returncode == 2 and says in result.stderr and not (tmp_path / "o").exists()


def test_tp_that_does_not_divide_the_heads_is_refused(tmp_path, targets):
    result = run_export(
        "--target",
        targets["llama"],
        "--draft",
        "none",
        "--format",
        "tensorrt-llm",
        "--tp",
        "3",
        "--out",
        tmp_path / "o",
    )
    assert result.returncode == 2 and "--tp 3 must divide the 4 attention heads" in result.stderr


def test_qwen3_eagle3_draft_with_qk_norm_is_refused(tmp_path, targets, drafts):
    result = run_export(
        "--target",
        targets["qwen3"],
        "--draft",
        drafts["qwen3", "eagle3"],
        "--format",
        "tensorrt-llm",
        "--out",
        tmp_path / "o",
    )
    assert result.returncode == 2 and "tensorrt-llm cannot load" in result.stderr and "q/k-norm" in result.stderr


def test_build_runs_build_sh_where_the_toolchain_is_present(tmp_path, targets, monkeypatch):
    """Where tensorrt_llm and a GPU exist, --build runs the written build.sh in the output (faked here: the script
    stands in for trtllm-build) and the manifest names the engine directory."""
    from export.formats import tensorrt_llm

    monkeypatch.setattr(tensorrt_llm, "build_blockers", lambda: [])
    monkeypatch.setattr(
        tensorrt_llm,
        "build_script",
        lambda job: "#!/bin/sh\nset -e\ntest -f checkpoint/rank0.safetensors\nmkdir engine\n",
    )
    out = _export(tmp_path, targets["llama"], "--draft", "none", "--build")
    assert (out / "engine").is_dir()
    assert json.loads((out / "manifest.json").read_text())["engine_dir"] == "engine"
    monkeypatch.setattr(tensorrt_llm, "build_script", lambda job: "#!/bin/sh\necho no GPU after all >&2\nexit 3\n")
    result = run_export(
        "--target",
        targets["llama"],
        "--draft",
        "none",
        "--format",
        "tensorrt-llm",
        "--build",
        "--out",
        tmp_path / "failed",
    )
    assert result.returncode == 2 and "build.sh failed (3): no GPU after all" in result.stderr
    assert not (tmp_path / "failed").exists()
