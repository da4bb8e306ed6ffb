"""Hugging Face Llama / Qwen2 / Qwen3 weights <-> a TensorRT-LLM checkpoint (config.json + rank{r}.safetensors).

Per rank r of tp (weights are [out, in]):

    transformer.vocab_embedding.weight          <- model.embed_tokens.weight            (every rank)
    transformer.layers.{i}.input_layernorm      <- input_layernorm                      (every rank)
    transformer.layers.{i}.attention.qkv        <- cat(q_r, k_r, v_r) on out            q heads split; K/V heads
                                                                                       split, or duplicated when
                                                                                       num_kv_heads < tp
    transformer.layers.{i}.attention.dense      <- o_proj, split on in
    transformer.layers.{i}.attention.{q,k}_layernorm <- q_norm / k_norm (Qwen3)         (every rank)
    transformer.layers.{i}.post_layernorm       <- post_attention_layernorm
    transformer.layers.{i}.mlp.fc               <- gate_proj, split on out              (the swap is TensorRT-LLM's:
    transformer.layers.{i}.mlp.gate             <- up_proj, split on out                 its "gate" is HF's up)
    transformer.layers.{i}.mlp.proj             <- down_proj, split on in
    transformer.ln_f.weight                     <- model.norm.weight
    lm_head.weight                              <- lm_head (or the tied embedding), vocab padded to a multiple of tp

`to_hf` inverts it exactly (tests map a checkpoint back and compare every tensor bit for bit).
"""

from __future__ import annotations

import torch

from export.errors import ExportError

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def check_sizes(arch, tp: int) -> None:
    if arch.family not in ARCHITECTURES:
        raise ExportError(
            f"tensorrt-llm: DeepSpec converts {', '.join(sorted(ARCHITECTURES))} targets, not {arch.family}"
        )
    if arch.num_heads % tp:
        raise ExportError(f"tensorrt-llm: --tp {tp} must divide the {arch.num_heads} attention heads")
    if arch.num_kv_heads % tp and tp % arch.num_kv_heads:
        raise ExportError(
            f"tensorrt-llm: --tp {tp} must divide, or be a multiple of, the {arch.num_kv_heads} key/value heads"
        )
    if arch.intermediate_size % tp:
        raise ExportError(f"tensorrt-llm: --tp {tp} must divide the MLP size {arch.intermediate_size}")


#: TensorRT-LLM's Qwen decoder layer reads `config.seq_length` (the logn-attention length), which no config class
#: defines; its `QWenConfig.from_hugging_face` falls back to this when the HF config has none
QWEN_SEQ_LENGTH = 8192


def checkpoint_config(arch, dtype: str, tp: int, hf_config: dict | None = None) -> dict:
    """config.json of the checkpoint. Every key whose TensorRT-LLM default (LLaMAConfig / QWenConfig /
    PretrainedConfig) differs from what this target needs is written: QWenConfig defaults `attn_bias` to True,
    which would make the builder ask a Qwen3 checkpoint for `attention.qkv.bias` tensors it does not have."""
    hf_config = hf_config or {}
    config = {
        "architecture": ARCHITECTURES[arch.family],
        "dtype": dtype,
        "logits_dtype": "float32",
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden_size,
        "num_hidden_layers": arch.num_layers,
        "num_attention_heads": arch.num_heads,
        "num_key_value_heads": arch.num_kv_heads,
        "head_size": arch.head_dim,
        "intermediate_size": arch.intermediate_size,
        "hidden_act": "silu",
        "norm_epsilon": arch.rms_norm_eps,
        "position_embedding_type": "rope_gpt_neox",
        "rotary_base": arch.rope_theta,
        "rotary_scaling": None,  # open_target refuses RoPE scaling the engine does not run
        "max_position_embeddings": arch.max_position_embeddings,
        "tie_word_embeddings": arch.tie_word_embeddings,
        "attn_bias": bool(arch.qkv_bias),
        "mlp_bias": False,
        "qk_layernorm": bool(arch.qk_norm),
        "mapping": {"world_size": tp, "tp_size": tp, "pp_size": 1},
        "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
    }
    if arch.family in ("qwen2", "qwen3"):
        config["qwen_type"] = arch.family  # the Qwen model keys q/k-norm and the MLP size off it
        config["seq_length"] = int(hf_config.get("seq_length") or QWEN_SEQ_LENGTH)
        config["use_logn_attn"] = False
    return config


def _split(t: torch.Tensor, tp: int, rank: int, dim: int) -> torch.Tensor:
    return t.chunk(tp, dim=dim)[rank] if tp > 1 else t


def _kv_heads(t: torch.Tensor, arch, tp: int, rank: int) -> torch.Tensor:
    """K or V weight/bias [nkv*hd, ...] -> this rank's heads (split, or the one head it shares when nkv < tp)."""
    heads = t.reshape(arch.num_kv_heads, arch.head_dim, *t.shape[1:])
    if arch.num_kv_heads >= tp:
        part = heads.chunk(tp, dim=0)[rank]
    else:
        part = heads[rank * arch.num_kv_heads // tp][None]
    return part.reshape(-1, *t.shape[1:])


def rank_tensors(get, arch, tp: int, rank: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """get(hf_name) -> tensor; the tensors of one rank, cast to dtype."""
    out = {
        "transformer.vocab_embedding.weight": get("model.embed_tokens.weight"),
        "transformer.ln_f.weight": get("model.norm.weight"),
    }
    for i in range(arch.num_layers):
        hf, trt = f"model.layers.{i}.", f"transformer.layers.{i}."
        attn = hf + "self_attn."
        for kind in ("weight", "bias") if arch.qkv_bias else ("weight",):
            q = _split(get(f"{attn}q_proj.{kind}"), tp, rank, 0)
            k = _kv_heads(get(f"{attn}k_proj.{kind}"), arch, tp, rank)
            v = _kv_heads(get(f"{attn}v_proj.{kind}"), arch, tp, rank)
            out[f"{trt}attention.qkv.{kind}"] = torch.cat([q, k, v], dim=0)
        out[f"{trt}attention.dense.weight"] = _split(get(f"{attn}o_proj.weight"), tp, rank, 1)
        if arch.qk_norm:
            out[f"{trt}attention.q_layernorm.weight"] = get(f"{attn}q_norm.weight")
            out[f"{trt}attention.k_layernorm.weight"] = get(f"{attn}k_norm.weight")
        out[f"{trt}input_layernorm.weight"] = get(hf + "input_layernorm.weight")
        out[f"{trt}post_layernorm.weight"] = get(hf + "post_attention_layernorm.weight")
        out[f"{trt}mlp.fc.weight"] = _split(get(hf + "mlp.gate_proj.weight"), tp, rank, 0)
        out[f"{trt}mlp.gate.weight"] = _split(get(hf + "mlp.up_proj.weight"), tp, rank, 0)
        out[f"{trt}mlp.proj.weight"] = _split(get(hf + "mlp.down_proj.weight"), tp, rank, 1)
    head = get("lm_head.weight") if not arch.tie_word_embeddings else get("model.embed_tokens.weight")
    pad = -arch.vocab_size % tp
    if pad:
        head = torch.cat([head, head.new_zeros(pad, head.shape[1])])
    out["lm_head.weight"] = _split(head, tp, rank, 0)
    return {k: v.to(dtype).contiguous() for k, v in out.items()}


def to_hf(ranks: list[dict[str, torch.Tensor]], arch) -> dict[str, torch.Tensor]:
    """The inverse: rank tensors -> Hugging Face names (for tests and for reading a checkpoint back)."""
    tp = len(ranks)
    r0 = ranks[0]
    q_rows = arch.num_heads * arch.head_dim // tp
    kv_rows = max(arch.num_kv_heads // tp, 1) * arch.head_dim
    out = {
        "model.embed_tokens.weight": r0["transformer.vocab_embedding.weight"],
        "model.norm.weight": r0["transformer.ln_f.weight"],
    }
    for i in range(arch.num_layers):
        hf, trt = f"model.layers.{i}.", f"transformer.layers.{i}."
        attn = hf + "self_attn."
        for kind in ("weight", "bias") if arch.qkv_bias else ("weight",):
            parts = [r[f"{trt}attention.qkv.{kind}"].split([q_rows, kv_rows, kv_rows]) for r in ranks]
            out[f"{attn}q_proj.{kind}"] = torch.cat([p[0] for p in parts])
            if arch.num_kv_heads >= tp:
                out[f"{attn}k_proj.{kind}"] = torch.cat([p[1] for p in parts])
                out[f"{attn}v_proj.{kind}"] = torch.cat([p[2] for p in parts])
            else:  # duplicated heads: rank r holds head r * nkv // tp
                step = tp // arch.num_kv_heads
                out[f"{attn}k_proj.{kind}"] = torch.cat([parts[h * step][1] for h in range(arch.num_kv_heads)])
                out[f"{attn}v_proj.{kind}"] = torch.cat([parts[h * step][2] for h in range(arch.num_kv_heads)])
        out[f"{attn}o_proj.weight"] = torch.cat([r[f"{trt}attention.dense.weight"] for r in ranks], dim=1)
        if arch.qk_norm:
            out[f"{attn}q_norm.weight"] = r0[f"{trt}attention.q_layernorm.weight"]
            out[f"{attn}k_norm.weight"] = r0[f"{trt}attention.k_layernorm.weight"]
        out[hf + "input_layernorm.weight"] = r0[f"{trt}input_layernorm.weight"]
        out[hf + "post_attention_layernorm.weight"] = r0[f"{trt}post_layernorm.weight"]
        out[hf + "mlp.gate_proj.weight"] = torch.cat([r[f"{trt}mlp.fc.weight"] for r in ranks])
        out[hf + "mlp.up_proj.weight"] = torch.cat([r[f"{trt}mlp.gate.weight"] for r in ranks])
        out[hf + "mlp.down_proj.weight"] = torch.cat([r[f"{trt}mlp.proj.weight"] for r in ranks], dim=1)
    head = torch.cat([r["lm_head.weight"] for r in ranks])[: arch.vocab_size]
    if not arch.tie_word_embeddings:
        out["lm_head.weight"] = head
    return out
