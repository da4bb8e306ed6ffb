"""EAGLE-3 drafts -> the canonical tensor set, then each engine's dialect of it, and what each engine refuses.

Both DeepSpec layouts (deepspec/models/drafts/eagle3.py) map onto one canonical set, H hidden, N draft vocabulary,
V target vocabulary, n captured layers:

    fc.weight [H, n*H] · midlayer.{input_layernorm, hidden_norm, post_attention_layernorm}.weight [H] ·
    midlayer.self_attn.{q,k,v}_proj.weight [., 2H] (embedding half first) · midlayer.self_attn.o_proj.weight ·
    midlayer.mlp.{gate,up,down}_proj.weight · norm.weight · lm_head.weight [N, H] · d2t [N] int64 offsets
    (target id = i + d2t[i]) · t2d [V] bool

The "deepspec" layout stores no head (it borrows the target's): `lm_head` is the target head's rows of the draft
vocabulary, the same numbers the worker computes with. Dialects: SGLang and TensorRT-LLM read `midlayer.*`; the
speculators layout that `vllm serve DIR` reads names the layer `layers.0.*`. The forward every engine runs: layer
input `cat(input_layernorm(embed(x)), hidden_norm(h))`, residual `h` (norm_before_residual = false), output
`norm(h')` -> lm_head, `h'` fed back.

The writers at the bottom (`VLLM`, `SGLANG`, `TENSORRT_LLM`) are what Eagle3's algorithm record names for each engine.
"""

from __future__ import annotations

import torch

from export import trtllm_releases
from export.errors import ExportError
from export.job import DraftWriter
from export.layer_ids import engine_layer_ids, hs_from_feature_layers

#: deepspec layout name -> canonical name
_DEEPSPEC_NAMES = {
    "embed_norm.weight": "midlayer.input_layernorm.weight",
    "hidden_norm.weight": "midlayer.hidden_norm.weight",
    "mlp_norm.weight": "midlayer.post_attention_layernorm.weight",
    "final_norm.weight": "norm.weight",
    "fc.weight": "fc.weight",
}
_DEEPSPEC_PREFIXES = {"attn.": "midlayer.self_attn.", "mlp.": "midlayer.mlp."}

#: engines of the EAGLE-3 family -> the key prefix of the layer
LAYER_PREFIX = {"sglang": "midlayer.", "tensorrt-llm": "midlayer.", "vllm": "layers.0."}


def canonical_tensors(draft, target) -> dict[str, torch.Tensor]:
    """DraftSource (either layout) + TargetSource -> the canonical tensor set (float32 weights)."""
    state = draft.weights()
    if draft.cfg.layout == "canonical":
        out = dict(state)
        out["d2t"], out["t2d"] = out["d2t"].long(), out["t2d"].bool()
        return out
    out = {}
    for name, tensor in state.items():
        if name in _DEEPSPEC_NAMES:
            out[_DEEPSPEC_NAMES[name]] = tensor
            continue
        prefix = next((p for p in _DEEPSPEC_PREFIXES if name.startswith(p)), None)
        if prefix is None:
            raise ExportError(f"draft {draft.path}: unexpected eagle3 tensor {name!r} (written by a newer DeepSpec?)")
        out[_DEEPSPEC_PREFIXES[prefix] + name[len(prefix) :]] = tensor
    d2t = draft.d2t()
    out["lm_head.weight"] = target.head_weight().float()[d2t].contiguous()
    out["d2t"] = d2t - torch.arange(d2t.numel())
    t2d = torch.zeros(draft.cfg.vocab_size, dtype=torch.bool)
    t2d[d2t] = True
    out["t2d"] = t2d
    return out


def dialect(tensors: dict[str, torch.Tensor], engine: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Canonical set -> the names `engine` loads, weights cast to dtype (d2t/t2d keep int64/bool)."""
    prefix = LAYER_PREFIX[engine]
    out = {}
    for name, tensor in tensors.items():
        if name.startswith("midlayer."):
            name = prefix + name[len("midlayer.") :]
        out[name] = tensor.to(dtype).contiguous() if tensor.is_floating_point() else tensor.contiguous()
    return out


#: where each engine fixes its EAGLE-3 `fc` at 3 * target_hidden_size inputs, whatever the draft's config says
_FC_SIZED_FOR_3 = {
    "vllm": "vllm model_executor/models/llama_eagle3.py `LlamaModel.__init__`: `fc_input_size = target_hidden_size "
    "* 3`; neither `eagle_aux_hidden_state_layer_ids` nor `eagle_config` changes it, so a [H, 5H] fc fails "
    "its weight loader",
    "sglang": "sglang srt/models/llama_eagle3.py `LlamaModel.__init__`",
    "tensorrt-llm": "tensorrt_llm/_torch/models/modeling_speculative.py `Eagle3DraftModel.__init__`, 1.2.1",
}


def blockers(engine: str, cfg, target_family: str, hs: tuple[int, ...]) -> list[str]:
    """Why `engine` cannot load this EAGLE-3 draft (empty: it can). cfg: the draft's DraftConfig."""
    reasons = []
    if target_family == "gemma3_text":
        reasons.append("its EAGLE-3 path does not run Gemma3 targets")
    if cfg.num_layers != 1:
        reasons.append(f"it loads a one-layer EAGLE-3 draft, this one has {cfg.num_layers}")
    if len(hs) != 3:
        reasons.append(
            f"its fc takes exactly 3 captured layers (3*H inputs), this draft captures {len(hs)} "
            f"({_FC_SIZED_FOR_3[engine]}): train the canonical recipe (layout: canonical, 3 layers) or "
            "`python -m training relayout` this draft into it"
        )
    if engine in ("sglang", "tensorrt-llm"):
        if cfg.qk_norm:
            reasons.append("its EAGLE-3 layer is Llama-style: the draft's q/k-norm weights would be dropped")
        if cfg.qkv_bias:
            reasons.append("its EAGLE-3 layer has no q/k/v bias: the draft's biases would be dropped")
        if cfg.norm_before_residual:
            reasons.append("it adds the residual before hidden_norm (norm_before_residual = false)")
    if engine == "tensorrt-llm" and target_family not in ("llama", "mistral", "qwen3"):
        reasons.append(f"its EAGLE-3 one-model path runs Llama and Qwen3 targets, not {target_family}")
    if engine == "vllm" and cfg.activation != "silu":
        reasons.append(f"the speculators layer is Llama/Qwen3-style (silu MLP), not {cfg.activation}")
    return reasons


def check(engine: str, job) -> None:
    """Every reason `engine` refuses job.draft (ExportError), the captured layers it cannot name included."""
    draft = job.draft
    hs = hs_from_feature_layers(draft.cfg.feature_layers)
    reasons = blockers(engine, draft.cfg, job.target.family, hs)
    if reasons:
        raise ExportError(f"{engine} cannot load the EAGLE-3 draft {draft.path.name}: " + "; ".join(reasons))
    engine_layer_ids(engine, hs)


def layer_config(cfg, target_config: dict, model_type: str) -> dict:
    """The HF decoder-layer config every engine builds the draft layer from (sizes of the draft's layer)."""
    return {
        "model_type": model_type,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": int(target_config.get("max_position_embeddings", 2048)),
        "vocab_size": cfg.vocab_size,
        "attention_bias": bool(cfg.qkv_bias),
        "tie_word_embeddings": False,
    }


def _convert_speculators(engine: str, job, dtype: torch.dtype) -> tuple[dict, dict, list[int]]:
    """vLLM: the speculators layout (`layers.0.*`, Eagle3Speculator naming its verifier)."""
    cfg = job.draft.cfg
    hs = hs_from_feature_layers(cfg.feature_layers)
    tensors = dialect(canonical_tensors(job.draft, job.target), engine, dtype)
    if cfg.qkv_bias:  # Llama attention_bias also biases o_proj; ours has none
        tensors["layers.0.self_attn.o_proj.bias"] = torch.zeros(cfg.hidden_size, dtype=dtype)
    return tensors, _speculators_config(job, hs), engine_layer_ids(engine, hs)


def _convert_midlayer(engine: str, job, dtype: torch.dtype) -> tuple[dict, dict, list[int]]:
    """SGLang, TensorRT-LLM: `LlamaForCausalLMEagle3` with `midlayer.*` keys."""
    hs = hs_from_feature_layers(job.draft.cfg.feature_layers)
    tensors = dialect(canonical_tensors(job.draft, job.target), engine, dtype)
    return tensors, _hf_config(job, engine, hs), engine_layer_ids(engine, hs)


def _hf_config(job, engine: str, hs) -> dict:
    """The `LlamaForCausalLMEagle3` directory SGLang and TensorRT-LLM load (midlayer.* keys)."""
    cfg = job.draft.cfg
    ids = engine_layer_ids(engine, hs)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        **layer_config(cfg, job.target.config, "llama"),
        "draft_vocab_size": cfg.out_vocab_size,
        "target_hidden_size": job.target.arch.hidden_size,
        "torch_dtype": job.dtype,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True},
    }
    if engine == "tensorrt-llm":
        config["eagle_config"]["eagle3_layers_to_capture"] = ids
    return config


def _speculators_config(job, hs) -> dict:
    """The speculators format (`vllm serve DIR`): Eagle3Speculator with the layer config nested."""
    cfg = job.draft.cfg
    model_type = "qwen3" if cfg.qk_norm else "llama"
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": _speculators_version(),
        "transformer_layer_config": layer_config(cfg, job.target.config, model_type),
        "draft_vocab_size": cfg.out_vocab_size,
        "target_hidden_size": job.target.arch.hidden_size,
        # absent means true to the speculators loader: always written
        "norm_before_residual": bool(cfg.norm_before_residual),
        "eagle_aux_hidden_state_layer_ids": engine_layer_ids("vllm", hs),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": job.num_speculative_tokens}],
            "default_proposal_method": "greedy",
            "verifier": {
                "name_or_path": str(job.target.path),
                "architectures": job.target.config.get("architectures") or [],
            },
        },
        "torch_dtype": job.dtype,
    }


def _speculators_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("speculators")
    except metadata.PackageNotFoundError:
        return "0.9.0"


def _trtllm_options(job) -> dict:
    """TensorRT-LLM's EAGLE-3 keys of `speculative_config` (export/snippets.py `trtllm_speculative_config`) for the
    pinned release (export/trtllm_releases.py): what selects the one-model path (1.2.x: `decoding_type: Eagle` +
    `eagle3_one_model: true`), `allow_advanced_sampling` (else sampled requests are verified greedily), and the
    captured layers, which it reads from here only and not from the draft's config.json."""
    hs = hs_from_feature_layers(job.draft.cfg.feature_layers)
    return {**trtllm_releases.release().eagle3_keys(), "eagle3_layers_to_capture": engine_layer_ids("tensorrt-llm", hs)}


VLLM = DraftWriter("eagle3", check, _convert_speculators, names_its_target=True)
SGLANG = DraftWriter("EAGLE3", check, _convert_midlayer)
#: `decoding_type` as the pinned TensorRT-LLM dispatches it (1.2.x has no `Eagle3`: `Invalid decoding type`)
TENSORRT_LLM = DraftWriter(
    trtllm_releases.release().eagle3_decoding_type,
    check,
    _convert_midlayer,
    speculative_options=_trtllm_options,
)
