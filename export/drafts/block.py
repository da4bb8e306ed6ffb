"""DFlash and DSpark drafts -> the layout vLLM and SGLang load (`DFlashDraftModel`, `Qwen3DSparkModel`).

Tensor names (ours -> theirs): `fc` -> `fc`, `context_norm` -> `hidden_norm`, `layers.i.attn_norm` ->
`layers.i.input_layernorm`, `layers.i.attn.*` -> `layers.i.self_attn.*` (q/k-norm included), `layers.i.mlp_norm`
-> `layers.i.post_attention_layernorm`, `final_norm` -> `norm`, plus `lm_head` (the target head's rows of the draft
vocabulary) and `d2t` offsets. DSpark: `markov_in` [N+1, r] (draft vocabulary + one row for every other token) ->
`markov_head.markov_w1.weight` [V, r] indexed by target id (row t = markov_in[t2d[t]], exact);
`markov_out` -> `markov_head.markov_w2.weight`; `confidence` -> `confidence_head.proj`.

The engines build the block from `embed(mask_token_id)`; DeepSpec trains the MASK vector itself. The export puts
it into the row of a token the draft can never propose (outside the draft vocabulary) and ships that embedding as
`embed_tokens.weight`, so an engine that loads the draft's own embedding computes exactly our block input.

The writers at the bottom (`DFLASH_VLLM`, `DFLASH_SGLANG`, `DSPARK_VLLM`, `DSPARK_SGLANG`) are what the DFlash and
DSpark algorithm records name for each engine.
"""

from __future__ import annotations

import torch

from export.errors import ExportError
from export.job import DraftWriter
from export.layer_ids import engine_layer_ids, hs_from_feature_layers

_LAYER_NAMES = {
    "attn_norm.": "input_layernorm.",
    "attn.": "self_attn.",
    "mlp_norm.": "post_attention_layernorm.",
    "mlp.": "mlp.",
}
_TOP_NAMES = {
    "fc.weight": "fc.weight",
    "context_norm.weight": "hidden_norm.weight",
    "final_norm.weight": "norm.weight",
    "markov_out.weight": "markov_head.markov_w2.weight",
    "confidence.weight": "confidence_head.proj.weight",
    "confidence.bias": "confidence_head.proj.bias",
}


def check(engine: str, job) -> None:
    """Every reason `engine` refuses job.draft (ExportError): its block layer is Qwen3-style."""
    draft, target = job.draft, job.target
    cfg, reasons = draft.cfg, []
    if target.family == "gemma3_text":
        reasons.append(
            "its DFlash/DSpark draft layer is Qwen3-style; Gemma3 targets (scaled embeddings, GeGLU) are not served"
        )
    if cfg.qkv_bias:
        reasons.append("its Qwen3-style draft layer has no q/k/v bias: the draft's biases would be dropped")
    if cfg.activation != "silu":
        reasons.append(f"its draft MLP is silu, not {cfg.activation}")
    if cfg.rope_theta != target.arch.rope_theta:
        reasons.append(f"rope_theta {cfg.rope_theta} differs from the target's {target.arch.rope_theta}")
    if reasons:
        raise ExportError(f"{engine} cannot load the {draft.algo} draft {draft.path.name}: " + "; ".join(reasons))


def mask_token_id(d2t: torch.Tensor, vocab_size: int) -> int:
    """The highest target id outside the draft vocabulary (never proposed), else the last id."""
    inside = torch.zeros(vocab_size, dtype=torch.bool)
    inside[d2t] = True
    outside = (~inside).nonzero().flatten()
    return int(outside[-1]) if outside.numel() else vocab_size - 1


def _block_layout(
    draft, target, state: dict[str, torch.Tensor], dtype: torch.dtype, architecture: str
) -> tuple[dict[str, torch.Tensor], dict]:
    """(float32 tensors, config.json) of the engine layout from the draft's weights `state`, all but DSpark's
    Markov W1 (`_convert_dspark` adds it)."""
    cfg = draft.cfg
    d2t = draft.d2t()
    n = d2t.numel()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name in _TOP_NAMES:
            out[_TOP_NAMES[name]] = tensor
        elif name.startswith("layers."):
            _, index, rest = name.split(".", 2)
            prefix = next((p for p in _LAYER_NAMES if rest.startswith(p)), None)
            if prefix is None:
                raise ExportError(f"draft {draft.path}: unexpected {draft.algo} tensor {name!r}")
            out[f"layers.{index}.{_LAYER_NAMES[prefix]}{rest[len(prefix) :]}"] = tensor
        elif name not in ("mask_embedding", "markov_in.weight"):
            raise ExportError(f"draft {draft.path}: unexpected {draft.algo} tensor {name!r}")
    mask_id = mask_token_id(d2t, cfg.vocab_size)
    embed = target.tensor("model.embed_tokens.weight").float().clone()
    embed[mask_id] = state["mask_embedding"]
    out["embed_tokens.weight"] = embed
    out["lm_head.weight"] = target.head_weight().float()[d2t].contiguous()
    if cfg.draft_vocab_size:
        out["d2t"] = d2t - torch.arange(n)
    hs = hs_from_feature_layers(cfg.feature_layers)
    config = {
        "architectures": [architecture],
        "model_type": "qwen3",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": cfg.num_layers,
        "num_target_layers": target.arch.num_layers,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": int(target.config.get("max_position_embeddings", 2048)),
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.out_vocab_size,
        "target_hidden_size": target.arch.hidden_size,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "block_size": cfg.block_size,
        "dflash_config": {"mask_token_id": mask_id, "target_layer_ids": engine_layer_ids("dflash", hs)},
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    return out, config


def _cast(tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Weights in the export dtype; integer maps (d2t) as they are."""
    return {k: v.to(dtype).contiguous() if v.is_floating_point() else v.contiguous() for k, v in tensors.items()}


def _convert_dflash(engine: str, job, dtype: torch.dtype) -> tuple[dict, dict, list[int]]:
    tensors, config = _block_layout(job.draft, job.target, job.draft.weights(), dtype, "DFlashDraftModel")
    return _cast(tensors, dtype), config, config["dflash_config"]["target_layer_ids"]


def _convert_dspark(engine: str, job, dtype: torch.dtype) -> tuple[dict, dict, list[int]]:
    """DFlash's layout (W2 and the confidence head renamed with it) plus the Markov W1, expanded from the draft
    vocabulary (+ one shared row) to every target id, and the Markov keys of config.json."""
    draft = job.draft
    cfg, state = draft.cfg, draft.weights()
    tensors, config = _block_layout(draft, job.target, state, dtype, "Qwen3DSparkModel")
    d2t = draft.d2t()
    n = d2t.numel()
    t2d = torch.full((cfg.vocab_size,), n, dtype=torch.long)
    t2d[d2t] = torch.arange(n)
    tensors["markov_head.markov_w1.weight"] = state["markov_in.weight"][t2d].contiguous()
    config.update(
        markov_rank=cfg.markov_rank,
        markov_head_type="vanilla",
        enable_confidence_head=True,
        confidence_threshold=cfg.confidence_threshold,
    )
    return _cast(tensors, dtype), config, config["dflash_config"]["target_layer_ids"]


DFLASH_VLLM = DraftWriter("dflash", check, _convert_dflash)
DFLASH_SGLANG = DraftWriter("DFLASH", check, _convert_dflash)
DSPARK_VLLM = DraftWriter("dspark", check, _convert_dspark)
DSPARK_SGLANG = DraftWriter("DSPARK", check, _convert_dspark)
