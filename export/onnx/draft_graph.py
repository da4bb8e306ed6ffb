"""An Eagle3 draft as ONNX graphs: `draft_fc.onnx` (captured target features → the draft's hidden) and
`draft_step.onnx` (one cached step of its decoder layer: what `Eagle3Draft.cached_step` computes, plus the head).

`draft_step.onnx`, B rows × T pairs (hidden h, token x) at positions start[b] .. start[b]+T-1:

    inputs   hidden [B, T, H] pre-norm h (fc(F) for committed pairs, the last output while drafting),
             input_ids [B, T], seqlens_k int32 [B] (= start + T - 1), total_sequence_length int32 [],
             past_key / past_value [B, nkv, S, hd]   the draft's own per-slot cache (its layout already)
    outputs  hidden_out [B, T, H] (h', the next step's h), logits [B, T, N] over the draft vocabulary,
             token_ids [B, T] = d2t[argmax(logits)] (greedy drafts as target ids), present_key / present_value

Attention is the same `GroupQueryAttention` as the target graph (RoPE with the draft's theta, cache updated in
place when bound to the same buffer). The frozen embedding and head rows are the target's, copied in.
DFlash and DSpark drafts (block drafting over a context) are not exported as graphs: `--format onnx` copies their
directory, and the worker runs them in PyTorch on the ONNX target's features.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from export.onnx.graph import MS_DOMAIN, OPSET, _Builder, _Weights


def _save(builder: _Builder, weights: _Weights, name: str, inputs, outputs, out_dir: Path) -> Path:
    weights.close()
    graph = helper.make_graph(builder.nodes, name, inputs, outputs, initializer=weights.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)],
                              producer_name="deepspec-export")
    model.ir_version = 10
    path = out_dir / f"{name}.onnx"
    onnx.save_model(model, path)
    return path


def build_eagle3_graphs(draft, out_dir: Path, max_positions: int) -> list[Path]:
    """Write draft_fc.onnx and draft_step.onnx for an attached `Eagle3Draft` (float32); returns their paths."""
    cfg = draft.cfg
    if cfg.algo != "eagle3":
        raise ValueError(f"only Eagle3 drafts are exported as ONNX graphs, not {cfg.algo}")
    if cfg.head_dim % 16:
        raise ValueError(f"GroupQueryAttention needs head_dim % 16 == 0 (this draft: {cfg.head_dim})")
    np_ = lambda t: t.detach().float().cpu().numpy()  # noqa: E731
    H, N = cfg.hidden_size, cfg.out_vocab_size
    embed_norm, hidden_norm, attn, mlp_norm, mlp = draft._parts

    weights = _Weights(out_dir / "draft_fc.onnx.data")
    g = _Builder(weights)
    g.op("MatMul", ["features", weights.add("fc.weight_t", np_(draft.fc.weight).T)], outputs=["hidden"])
    _save(g, weights, "draft_fc", [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["B", "T", cfg.feature_size])],
          [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["B", "T", H])], out_dir)

    weights = _Weights(out_dir / "draft_step.onnx.data")
    g = _Builder(weights)
    eps = cfg.rms_norm_eps
    half = cfg.head_dim // 2
    inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, cfg.head_dim, 2, dtype=np.float32) / cfg.head_dim))
    angles = np.arange(max_positions, dtype=np.float32)[:, None] * inv_freq[None, :].astype(np.float32)
    cos, sin = weights.add("rope.cos", np.cos(angles)[:, :half]), weights.add("rope.sin", np.sin(angles)[:, :half])
    emb = g.op("Gather", [weights.add("embed.weight", np_(draft._embed)), "input_ids"])
    if draft._embed_scale != 1.0:
        emb = g.op("Mul", [emb, g.const("embed.scale", np.float32(draft._embed_scale))])
    x = g.op("Concat", [g.rms_norm(emb, np_(embed_norm.weight), eps, "embed_norm"),
                        g.rms_norm("hidden", np_(hidden_norm.weight), eps, "hidden_norm")], axis=-1)

    def proj(module, name):
        return g.linear(x, np_(module.weight), name, "none", np_(module.bias) if module.bias is not None else None)

    q, k, v = proj(attn.q_proj, "q_proj"), proj(attn.k_proj, "k_proj"), proj(attn.v_proj, "v_proj")
    if attn.q_norm is not None:
        heads = lambda t, n: g.op("Reshape", [t, g.const(f"shape.{n}", np.array([0, 0, -1, cfg.head_dim], np.int64))])  # noqa: E731
        flat = g.const("shape.flat", np.array([0, 0, -1], np.int64))
        q = g.op("Reshape", [g.rms_norm(heads(q, "q"), np_(attn.q_norm.weight), eps, "q_norm"), flat])
        k = g.op("Reshape", [g.rms_norm(heads(k, "k"), np_(attn.k_norm.weight), eps, "k_norm"), flat])
    a = g.op("GroupQueryAttention", [q, k, v, "past_key", "past_value", "seqlens_k", "total_sequence_length", cos, sin],
             outputs=["attn", "present_key", "present_value"], domain=MS_DOMAIN, num_heads=cfg.num_heads,
             kv_num_heads=cfg.num_kv_heads, scale=float(cfg.head_dim ** -0.5), do_rotary=1, rotary_interleaved=0)[0]
    a = g.linear(a, np_(attn.o_proj.weight), "o_proj", "none")
    base = g.rms_norm("hidden", np_(hidden_norm.weight), eps, "residual_norm") if cfg.norm_before_residual else "hidden"
    h = g.op("Add", [base, a])
    m_in = g.rms_norm(h, np_(mlp_norm.weight), eps, "mlp_norm")
    gate = g.linear(m_in, np_(mlp.gate_proj.weight), "gate_proj", "none")
    act = g.op("Gelu", [gate], approximate="tanh") if mlp.gelu else g.op("Mul", [gate, g.op("Sigmoid", [gate])])
    up = g.linear(m_in, np_(mlp.up_proj.weight), "up_proj", "none")
    g.op("Add", [h, g.linear(g.op("Mul", [act, up]), np_(mlp.down_proj.weight), "down_proj", "none")],
         outputs=["hidden_out"])
    norm = draft.norm if cfg.layout == "canonical" else draft.final_norm
    head = draft.lm_head.weight if cfg.layout == "canonical" else draft._head
    g.op("MatMul", [g.rms_norm("hidden_out", np_(norm.weight), eps, "final_norm"),
                    weights.add("head.weight_t", np_(head).T)], outputs=["logits"])
    g.op("Gather", [weights.add("d2t", draft.d2t.cpu().numpy().astype(np.int64)),
                    g.op("ArgMax", ["logits"], axis=-1, keepdims=0)], outputs=["token_ids"])
    cache = ["B", cfg.num_kv_heads, "S", cfg.head_dim]
    inputs = [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["B", "T", H]),
              helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", "T"]),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
              helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
              helper.make_tensor_value_info("past_key", TensorProto.FLOAT, cache),
              helper.make_tensor_value_info("past_value", TensorProto.FLOAT, cache)]
    outputs = [helper.make_tensor_value_info("hidden_out", TensorProto.FLOAT, ["B", "T", H]),
               helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", "T", N]),
               helper.make_tensor_value_info("token_ids", TensorProto.INT64, ["B", "T"]),
               helper.make_tensor_value_info("present_key", TensorProto.FLOAT, cache),
               helper.make_tensor_value_info("present_value", TensorProto.FLOAT, cache)]
    step = _save(g, weights, "draft_step", inputs, outputs, out_dir)
    return [out_dir / "draft_fc.onnx", step]
