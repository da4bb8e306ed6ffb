"""Draft formats for vLLM and SGLang: real loaders and the engines' own rules, on tiny targets of every family.

- vLLM: the `speculators` package (PyPI) loads the exported directory and its EAGLE-3 layer computes our draft's
  logits on the same features.
- SGLang: its key filter (tests/export/sglang_loader.py) drops nothing and fills every parameter it owns.
- What an engine cannot load is refused with the engine and the reason, and nothing is written.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.export.conftest import run_export, write_draft
from tests.export.sglang_loader import sglang_load, sglang_parameters


def export_ok(*args):
    out = run_export(*args)
    assert out.returncode == 0, out.stderr
    return out


@pytest.fixture(scope="module")
def canonical_llama(tmp_path_factory, targets):
    return write_draft(
        tmp_path_factory.mktemp("canon") / "d", targets["llama"], "eagle3", layout="canonical", feature_layers=(1, 2, 3)
    )


def _speculators_logits(draft_dir, target_dir, features, tokens):
    """One EAGLE-3 step through the speculators package's own modules: [T, N] logits."""
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from transformers import AutoModelForCausalLM

    config = Eagle3SpeculatorConfig.from_pretrained(draft_dir)
    config.transformer_layer_config._attn_implementation = "sdpa"
    model = Eagle3DraftModel.from_pretrained(draft_dir, config=config).eval()
    hf = AutoModelForCausalLM.from_pretrained(target_dir)
    model.embed_tokens.weight.data.copy_(hf.get_input_embeddings().weight)  # shared with the target in vLLM
    T = tokens.shape[1]
    positions = torch.arange(T)[None]
    with torch.no_grad():
        h = model.fc(features)
        x = torch.cat([model.embed_tokens(tokens), h], dim=-1)
        out = model.layers[0](
            x, attention_mask=None, position_ids=positions, position_embeddings=model.rotary_emb(x, positions)
        )
        out = out[0] if isinstance(out, tuple) else out
        return model.lm_head(model.norm(out))[0], model


def _our_logits(draft_dir, target_dir, features, tokens):
    from deepspec.models import load_target
    from deepspec.models.drafts import load_draft

    target = load_target(str(target_dir))
    draft = load_draft(draft_dir, target)
    with torch.no_grad():
        return draft.ttt_forward(features, tokens, 1)[0][0], draft, target


@pytest.mark.parametrize(
    "family, layout", [("llama", "deepspec"), ("qwen3", "deepspec"), ("qwen2", "deepspec"), ("llama", "canonical")]
)
def test_speculators_loads_the_vllm_export_and_computes_our_logits(
    tmp_path, targets, drafts, canonical_llama, family, layout
):
    draft_dir = canonical_llama if layout == "canonical" else drafts[family, "eagle3"]
    out = tmp_path / "vllm"
    export_ok("--target", targets[family], "--draft", draft_dir, "--format", "vllm", "--dtype", "float32", "--out", out)
    g = torch.Generator().manual_seed(0)
    ours, draft, target = None, None, None
    from deepspec.models import load_target

    target = load_target(str(targets[family]))
    layers = draft_feature_layers(draft_dir)
    tokens = torch.randint(128, (1, 12), generator=g)
    features = target.forward(tokens, torch.zeros(1, dtype=torch.long), feature_layers=layers).features
    shifted = torch.cat([tokens[:, 1:], torch.zeros(1, 1, dtype=torch.long)], dim=1)  # pair (F[t], x[t+1])
    ours, draft, _ = _our_logits(draft_dir, targets[family], features, tokens)
    theirs, model = _speculators_logits(out / "draft", targets[family], features, shifted)
    assert model.config.eagle_aux_hidden_state_layer_ids == [i + 1 for i in layers]  # hs indices
    assert not model.config.norm_before_residual
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4)
    d2t = load_file(out / "draft" / "model.safetensors")["d2t"]
    assert torch.equal(d2t + torch.arange(d2t.numel()), draft.d2t)  # offsets -> our absolute ids


def draft_feature_layers(draft_dir):
    return tuple(json.loads((draft_dir / "config.json").read_text())["feature_layers"])


@pytest.mark.parametrize("layout", ["deepspec", "canonical"])
def test_sglang_key_filter_drops_nothing(tmp_path, targets, drafts, canonical_llama, layout):
    draft_dir = canonical_llama if layout == "canonical" else drafts["llama", "eagle3"]
    out = tmp_path / "sglang"
    export_ok("--target", targets["llama"], "--draft", draft_dir, "--format", "sglang", "--out", out)
    config = json.loads((out / "draft" / "config.json").read_text())
    names = load_file(out / "draft" / "model.safetensors").keys()
    loaded, dropped = sglang_load(names, config)
    assert dropped == []
    assert loaded == sglang_parameters(config) - {"model.embed_tokens.weight"}  # the embedding is the target's
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["tie_word_embeddings"] is False
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # SGLang adds 1: hs 2, 3, 4
    launch = (out / "launch" / "sglang.sh").read_text()
    assert "--speculative-algorithm EAGLE3" in launch and "--speculative-draft-model-path draft" in launch


def test_the_sglang_filter_would_catch_a_speculators_layout(tmp_path, targets, drafts):
    """Negative control: the vLLM dialect's `layers.0.*` names are exactly what SGLang drops without a word."""
    out = tmp_path / "vllm"
    export_ok("--target", targets["llama"], "--draft", drafts["llama", "eagle3"], "--format", "vllm", "--out", out)
    _, dropped = sglang_load(load_file(out / "draft" / "model.safetensors").keys(), {})
    assert dropped and all(name.startswith("layers.0.") for name in dropped)


@pytest.mark.parametrize(
    "family, engine, says",
    [
        ("gemma3_text", "vllm", "does not run Gemma3 targets"),
        ("gemma3_text", "sglang", "does not run Gemma3 targets"),
        ("qwen3", "sglang", "q/k-norm"),
        ("qwen2", "sglang", "q/k/v bias"),
    ],
)
def test_engines_refuse_what_they_cannot_load(tmp_path, targets, drafts, family, engine, says):
    out = tmp_path / "out"
    result = run_export(
        "--target", targets[family], "--draft", drafts[family, "eagle3"], "--format", engine, "--out", out
    )
    assert result.returncode == 2
    assert f"{engine} cannot load" in result.stderr and says in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists() and not list(tmp_path.glob(".out*"))


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tensorrt-llm"])
def test_more_than_three_captured_layers_are_refused_by_every_engine(tmp_path, targets, engine):
    """Every engine's EAGLE-3 draft sizes `fc` for 3 captured layers, whatever the draft's config says:
    vllm-project/vllm vllm/model_executor/models/llama_eagle3.py `LlamaModel.__init__` (`fc_input_size =
    target_hidden_size * 3`; the speculators config's `eagle_aux_hidden_state_layer_ids`, copied by
    vllm/transformers_utils/configs/speculators/algos.py `update_eagle3`, only picks the target layers), SGLang's and
    TensorRT-LLM's likewise. A 5-layer (deepspec layout) draft's [H, 5H] fc would fail the weight loader, so the
    export refuses it naming the way out, and no longer sends the user to vLLM."""
    five = write_draft(tmp_path / "five", targets["llama"], "eagle3", feature_layers=(0, 1, 2, 3, 4))
    result = run_export("--target", targets["llama"], "--draft", five, "--format", engine, "--out", tmp_path / "o")
    assert result.returncode == 2 and "exactly 3 captured layers (3*H inputs), this draft captures 5" in result.stderr
    assert "layout: canonical" in result.stderr and "relayout" in result.stderr
    assert "export for vllm" not in result.stderr and not (tmp_path / "o").exists()


@pytest.mark.parametrize("algo", ["dflash", "dspark"])
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_block_drafts_layout(tmp_path, targets, drafts, algo, engine):
    out = tmp_path / engine
    export_ok(
        "--target",
        targets["llama"],
        "--draft",
        drafts["llama", algo],
        "--format",
        engine,
        "--dtype",
        "float32",
        "--out",
        out,
    )
    config = json.loads((out / "draft" / "config.json").read_text())
    tensors = load_file(out / "draft" / "model.safetensors")
    ours = load_file(drafts["llama", algo] / "model.safetensors")
    d2t = load_file(drafts["llama", algo] / "vocab_map.safetensors")["d2t"]
    assert config["architectures"] == [{"dflash": "DFlashDraftModel", "dspark": "Qwen3DSparkModel"}[algo]]
    assert config["dflash_config"]["target_layer_ids"] == [1, 2, 3]  # "output of layer" ids = our feature layers
    mask_id = config["dflash_config"]["mask_token_id"]
    assert mask_id not in d2t.tolist()  # a token the draft never proposes carries the trained MASK vector
    torch.testing.assert_close(tensors["embed_tokens.weight"][mask_id].float(), ours["mask_embedding"].float())
    for i in range(2):
        assert f"layers.{i}.self_attn.q_norm.weight" in tensors and f"layers.{i}.input_layernorm.weight" in tensors
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "lm_head.weight", "d2t"} <= set(tensors)
    assert tensors["lm_head.weight"].shape[0] == d2t.numel() == config["draft_vocab_size"]
    if algo == "dspark":
        w1 = tensors["markov_head.markov_w1.weight"].float()
        assert w1.shape[0] == 128 and config["markov_rank"] == w1.shape[1]
        inside = ours["markov_in.weight"].float()
        torch.testing.assert_close(w1[d2t], inside[: d2t.numel()])
        outside = torch.ones(128, dtype=torch.bool)
        outside[d2t] = False
        assert torch.equal(w1[outside], inside[-1:].expand(int(outside.sum()), -1))


@pytest.mark.slow
def test_shipped_eagle3_for_vllm_on_the_default_target(tmp_path):
    """The shipped draft (canonical layout, the engines' 3 default layers) through the real speculators loader on
    SmolLM2."""
    from deepspec.models import load_target
    from deepspec.paths import repo_root

    draft_dir = repo_root() / "drafts" / "smollm2-135m-eagle3"
    out = tmp_path / "vllm"
    export_ok("--draft", draft_dir, "--format", "vllm", "--dtype", "float32", "--out", out)
    target = load_target("smollm2-135m")
    layers = draft_feature_layers(draft_dir)
    tokens = torch.tensor([target.encode("def fibonacci(n):\n    if n < 2:\n        return n")])
    features = target.forward(tokens, torch.zeros(1, dtype=torch.long), feature_layers=layers).features
    shifted = torch.cat([tokens[:, 1:], torch.zeros(1, 1, dtype=torch.long)], dim=1)
    ours, _, _ = _our_logits(draft_dir, "smollm2-135m", features, tokens)
    theirs, model = _speculators_logits(out / "draft", target.path, features, shifted)
    assert model.config.eagle_aux_hidden_state_layer_ids == [2, 15, 27]  # vLLM's default (2, L // 2, L - 3)
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=2e-4)
