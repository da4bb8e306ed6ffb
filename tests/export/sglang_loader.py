"""A re-implementation of SGLang's EAGLE-3 weight-name filter (`LlamaForCausalLMEagle3.load_weights`), to prove an
export loses nothing in SGLang: its loader skips every name it has no parameter for, without an error.

SGLang builds these parameters: `model.embed_tokens`, `model.fc` (input 3*target_hidden_size), `model.midlayer.*`
with fused `qkv_proj` and `gate_up_proj`, `model.norm`, and `lm_head` unless `tie_word_embeddings`. A checkpoint
name is tried as-is, then with `model.` in front, after renaming q/k/v_proj -> qkv_proj and gate/up_proj ->
gate_up_proj; `d2t` is consumed as the hot-token map and `t2d` ignored.
"""

from __future__ import annotations

_STACKED = (
    (".q_proj", ".qkv_proj"),
    (".k_proj", ".qkv_proj"),
    (".v_proj", ".qkv_proj"),
    (".gate_proj", ".gate_up_proj"),
    (".up_proj", ".gate_up_proj"),
)


def sglang_parameters(config: dict) -> set[str]:
    layer = "model.midlayer."
    params = {
        "model.embed_tokens.weight",
        "model.fc.weight",
        "model.norm.weight",
        layer + "self_attn.qkv_proj.weight",
        layer + "self_attn.o_proj.weight",
        layer + "mlp.gate_up_proj.weight",
        layer + "mlp.down_proj.weight",
        layer + "input_layernorm.weight",
        layer + "hidden_norm.weight",
        layer + "post_attention_layernorm.weight",
    }
    if config.get("bias"):
        params.add("model.fc.bias")
    if not config.get("tie_word_embeddings"):
        params.add("lm_head.weight")
    return params


def sglang_load(names, config: dict) -> tuple[set[str], list[str]]:
    """-> (parameters that received a tensor, checkpoint names SGLang would silently drop)."""
    params, loaded, dropped = sglang_parameters(config), set(), []
    for original in names:
        if original in ("d2t", "t2d"):
            continue
        name = original
        for old, new in _STACKED:
            if old in name:
                name = name.replace(old, new)
                param = f"model.{name}" if name not in params else name
                break
        else:
            param = name if name in params else f"model.{name}"
        if param in params:
            loaded.add(param)
        else:
            dropped.append(original)
    return loaded, dropped
