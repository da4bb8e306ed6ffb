"""The neural drafts (Eagle3, DFlash, DSpark) as ONNX graphs, one small graph per call their drafter makes.

Each graph computes exactly one method of the PyTorch draft model (deepspec/models/drafts/), so the worker's
drafters (deepspec/decoding/drafters/) run unchanged on top of them: `OnnxDraftModel`
(deepspec/decoding/drafters/onnx_graphs.py) stands in for the PyTorch module and calls these graphs. The draft's KV
cache stays the drafter's own tensor; graphs take the rows they read and return the entries they write.

Eagle3 (`eagle3_fc`, `eagle3_step`, `eagle3_head`):

    eagle3_fc     features [B, T, F] → hidden [B, T, H]                                      Eagle3Draft.fc
    eagle3_step   hidden [B, m, H], input_ids [B, m], positions [B, m], cache_key/value [B, nkv, K, hd] (the rows'
                  entries 0..K-1), write_index [B, m] (entry each pair is written to, < K), visible [B, m, K] bool
                  → hidden_out [B, m, H], new_key/new_value [B, nkv, m, hd]                   Eagle3Draft.cached_step
    eagle3_head   hidden [B, T, H] (pre-norm) → logits [B, T, N]                             Eagle3Draft.logits

DFlash / DSpark (`dflash_context`, `dflash_block`, and `dspark_markov` for DSpark; each algorithm's record names
its builder, `build_draft_graphs` looks it up):

    dflash_context  features [B, T, F], positions [B, T] → context_key.{l} / context_value.{l} [B, nkv, T, hd]
                    per draft layer l                                   context_kv(context(F), positions)
    dflash_block    anchor [B] (target ids), positions [B, γ], context_key.{l} / context_value.{l} [B, nkv, K, hd],
                    visible [B, γ, K + γ] bool → hidden [B, γ, H] (post-norm), logits [B, γ, N]
                                                                        blocks(block_input(anchor), ...), head
    dspark_markov   hidden [B, W, H], base_logits [B, W, N], prev_tokens [B, W] (target ids)
                    → logits [B, W, N], confidence [B, W] (logit)        DSparkDraft.step_logits

Attention here is plain ONNX ops with an explicit visibility mask (the draft caches are small, and DFlash's block
attends bidirectionally, Eagle3's trees by ancestry: neither is the causal pattern of GroupQueryAttention). The
dense layers and the head are float32, or int8 / int4 as `quantization` says (the export makes them int8 beside a
quantized target: exporter.DRAFT_QUANTIZATION); the frozen embedding rows are the target's, copied in. Heads are
grouped as PyTorch's `enable_gqa` groups them: query head h reads key/value head h // (nh / nkv).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from deepspec.algorithms import load_part, resolve_algorithm
from deepspec.models.drafts.dflash import DFlashDraft
from deepspec.models.drafts.dspark import DSparkDraft
from deepspec.models.drafts.eagle3 import Eagle3Draft
from export.onnx.graph import MS_DOMAIN, OPSET, _Builder, _Weights

_F, _I64, _BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _info(name: str, dtype: int, dims) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, dims)


def _save(builder: _Builder, weights: _Weights, name: str, inputs, outputs, out_dir: Path) -> Path:
    weights.close()
    graph = helper.make_graph(builder.nodes, name, inputs, outputs, initializer=weights.initializers)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)],
        producer_name="deepspec-export",
    )
    model.ir_version = 10
    path = out_dir / f"{name}.onnx"
    onnx.save_model(model, path)
    return path


def _np(t) -> np.ndarray:
    return t.detach().float().cpu().numpy()


class _DraftBuilder(_Builder):
    """`_Builder` plus the pieces of the drafts' layers (deepspec/models/drafts/layers.py) in plain ops."""

    def __init__(self, weights: _Weights, cfg, quantization: str = "none"):
        super().__init__(weights)
        self.cfg = cfg
        #: the dense layers' weight format (export/onnx/graph.py `linear`): "none" (fp32), "int8" or "int4"
        self.quantization = quantization
        hd = cfg.head_dim
        inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, hd, 2, dtype=np.float32) / hd))
        self.inv_freq = self.const("rope.inv_freq", inv_freq.astype(np.float32))  # [hd/2]
        self.axis_last = self.const("axes.last", np.array([-1], np.int64))
        self.axis_2 = self.const("axes.2", np.array([2], np.int64))
        self.half = self.const("split.half", np.array([hd // 2, hd // 2], np.int64))

    def norm(self, x: str, module, name: str) -> str:
        return self.rms_norm(x, _np(module.weight), module.eps, name)

    def dense(self, x: str, module, name: str) -> str:
        return self.linear(
            x, _np(module.weight), name, self.quantization, _np(module.bias) if module.bias is not None else None
        )

    def rope_tables(self, positions: str) -> tuple[str, str]:
        """positions [B, T] int64 → cos, sin [B, T, 1, hd/2] (broadcast over heads), layers.rope's angles."""
        angles = self.op(
            "Mul", [self.op("Unsqueeze", [self.op("Cast", [positions], to=_F), self.axis_last]), self.inv_freq]
        )  # [B, T, hd/2]
        angles = self.op("Unsqueeze", [angles, self.axis_2])
        return self.op("Cos", [angles]), self.op("Sin", [angles])

    def rope(self, x: str, cos: str, sin: str) -> str:
        """x [B, T, n, hd] rotated in halves (x1·cos − x2·sin, x2·cos + x1·sin)."""
        x1, x2 = self.op_outputs("Split", [x, self.half], num_outputs=2, axis=-1)
        return self.op(
            "Concat",
            [
                self.op("Sub", [self.op("Mul", [x1, cos]), self.op("Mul", [x2, sin])]),
                self.op("Add", [self.op("Mul", [x2, cos]), self.op("Mul", [x1, sin])]),
            ],
            axis=-1,
        )

    def heads(self, x: str, n: int) -> str:
        """[B, T, n·hd] → [B, T, n, hd]."""
        return self.op("Reshape", [x, self.const(f"shape.heads{n}", np.array([0, 0, n, self.cfg.head_dim], np.int64))])

    def query(self, attn, x: str, cos: str, sin: str, name: str) -> str:
        """Attention.query as [B, T, nh, hd] (RoPE'd, q-norm'd)."""
        q = self.heads(self.dense(x, attn.q_proj, f"{name}.q_proj"), self.cfg.num_heads)
        if attn.q_norm is not None:
            q = self.norm(q, attn.q_norm, f"{name}.q_norm")
        return self.rope(q, cos, sin)

    def key_value(self, attn, x: str, cos: str, sin: str, name: str) -> tuple[str, str]:
        """Attention.key_value as [B, nkv, T, hd] each."""
        nkv = self.cfg.num_kv_heads
        k = self.heads(self.dense(x, attn.k_proj, f"{name}.k_proj"), nkv)
        if attn.k_norm is not None:
            k = self.norm(k, attn.k_norm, f"{name}.k_norm")
        k = self.rope(k, cos, sin)
        v = self.heads(self.dense(x, attn.v_proj, f"{name}.v_proj"), nkv)
        return self.op("Transpose", [k], perm=[0, 2, 1, 3]), self.op("Transpose", [v], perm=[0, 2, 1, 3])

    def attend(self, attn, q: str, keys: str, values: str, visible: str, name: str) -> str:
        """q [B, T, nh, hd], keys/values [B, nkv, K, hd], visible [B, T, K] bool → o_proj(attention) [B, T, H]."""
        cfg = self.cfg
        group = cfg.num_heads // cfg.num_kv_heads
        q = self.op(
            "Reshape",
            [q, self.const("shape.groups", np.array([0, 0, cfg.num_kv_heads, group, cfg.head_dim], np.int64))],
        )
        q = self.op("Transpose", [q], perm=[0, 2, 3, 1, 4])  # [B, nkv, g, T, hd]
        k = self.op("Unsqueeze", [keys, self.axis_2])  # [B, nkv, 1, K, hd]
        v = self.op("Unsqueeze", [values, self.axis_2])
        scores = self.op(
            "Mul",
            [
                self.op("MatMul", [q, self.op("Transpose", [k], perm=[0, 1, 2, 4, 3])]),
                self.const("attn.scale", np.float32(cfg.head_dim**-0.5)),
            ],
        )  # [B, nkv, g, T, K]
        mask = self.op("Unsqueeze", [visible, self.const("axes.12", np.array([1, 2], np.int64))])  # [B, 1, 1, T, K]
        scores = self.op("Where", [mask, scores, self.const("attn.neg_inf", np.float32(-np.inf))])
        out = self.op("MatMul", [self.op("Softmax", [scores], axis=-1), v])  # [B, nkv, g, T, hd]
        out = self.op(
            "Reshape",
            [
                self.op("Transpose", [out], perm=[0, 3, 1, 2, 4]),
                self.const("shape.flat", np.array([0, 0, cfg.q_size], np.int64)),
            ],
        )
        return self.dense(out, attn.o_proj, f"{name}.o_proj")

    def mlp(self, x: str, module, name: str) -> str:
        gate = self.dense(x, module.gate_proj, f"{name}.gate_proj")
        act = (
            self.op("Gelu", [gate], approximate="tanh")
            if module.gelu
            else self.op("Mul", [gate, self.op("Sigmoid", [gate])])
        )
        return self.dense(
            self.op("Mul", [act, self.dense(x, module.up_proj, f"{name}.up_proj")]),
            module.down_proj,
            f"{name}.down_proj",
        )

    def embed(self, draft, ids: str) -> str:
        x = self.op("Gather", [self.w.add("embed.weight", _np(draft._embed)), ids])
        if draft._embed_scale != 1.0:
            x = self.op("Mul", [x, self.const("embed.scale", np.float32(draft._embed_scale))])
        return x

    def head(self, draft, hidden: str, out: str) -> str:
        """Post-norm hidden → logits over the draft vocabulary (the head rows the PyTorch draft multiplies by)."""
        canonical = getattr(draft.cfg, "layout", "deepspec") == "canonical"
        weight = draft.lm_head.weight if canonical else draft._head
        if self.quantization != "none":  # one node without a bias: its output renamed, as the target graph's head
            self.linear(hidden, _np(weight), "head", self.quantization)
            self.nodes[-1].output[0] = out
            return out
        return self.op("MatMul", [hidden, self.w.add("head.weight_t", _np(weight).T)], outputs=[out])


def _new(out_dir: Path, name: str, cfg, quantization: str = "none") -> tuple[_DraftBuilder, _Weights]:
    weights = _Weights(out_dir / f"{name}.onnx.data")
    return _DraftBuilder(weights, cfg, quantization), weights


def _check(cfg) -> None:
    if cfg.num_heads % cfg.num_kv_heads:
        raise ValueError(f"num_heads {cfg.num_heads} is not a multiple of num_kv_heads {cfg.num_kv_heads}")


def build_eagle3_graphs(draft, out_dir: Path, quantization: str = "none") -> list[Path]:
    """eagle3_fc / eagle3_step / eagle3_head for an attached `Eagle3Draft` (float32); returns their paths."""
    cfg = draft.cfg
    if not isinstance(draft, Eagle3Draft):
        raise ValueError(f"build_eagle3_graphs takes an Eagle3 draft, not {cfg.algo}")
    _check(cfg)
    H, N, nkv, hd = cfg.hidden_size, cfg.out_vocab_size, cfg.num_kv_heads, cfg.head_dim
    embed_norm, hidden_norm, attn, mlp_norm, mlp = draft._parts

    g, w = _new(out_dir, "eagle3_fc", cfg, quantization)
    g.linear("features", _np(draft.fc.weight), "fc", quantization)
    g.nodes[-1].output[0] = "hidden"
    fc = _save(
        g,
        w,
        "eagle3_fc",
        [_info("features", _F, ["B", "T", cfg.feature_size])],
        [_info("hidden", _F, ["B", "T", H])],
        out_dir,
    )

    g, w = _new(out_dir, "eagle3_step", cfg, quantization)
    x = g.op(
        "Concat",
        [g.norm(g.embed(draft, "input_ids"), embed_norm, "embed_norm"), g.norm("hidden", hidden_norm, "hidden_norm")],
        axis=-1,
    )
    cos, sin = g.rope_tables("positions")
    q = g.query(attn, x, cos, sin, "attn")
    k, v = g.key_value(attn, x, cos, sin, "attn")
    g.op("Identity", [k], outputs=["new_key"])
    g.op("Identity", [v], outputs=["new_value"])
    where = g.op(
        "Expand",
        [g.op("Unsqueeze", ["write_index", g.const("axes.13", np.array([1, 3], np.int64))]), g.op("Shape", [k])],
    )  # [B, nkv, m, hd]
    keys = g.op("ScatterElements", ["cache_key", where, k], axis=2)
    values = g.op("ScatterElements", ["cache_value", where, v], axis=2)
    a = g.attend(attn, q, keys, values, "visible", "attn")
    base = g.norm("hidden", hidden_norm, "residual_norm") if cfg.norm_before_residual else "hidden"
    h = g.op("Add", [base, a])
    g.op("Add", [h, g.mlp(g.norm(h, mlp_norm, "mlp_norm"), mlp, "mlp")], outputs=["hidden_out"])
    cache = ["B", nkv, "K", hd]
    step = _save(
        g,
        w,
        "eagle3_step",
        [
            _info("hidden", _F, ["B", "m", H]),
            _info("input_ids", _I64, ["B", "m"]),
            _info("positions", _I64, ["B", "m"]),
            _info("cache_key", _F, cache),
            _info("cache_value", _F, cache),
            _info("write_index", _I64, ["B", "m"]),
            _info("visible", _BOOL, ["B", "m", "K"]),
        ],
        [
            _info("hidden_out", _F, ["B", "m", H]),
            _info("new_key", _F, ["B", nkv, "m", hd]),
            _info("new_value", _F, ["B", nkv, "m", hd]),
        ],
        out_dir,
    )

    g, w = _new(out_dir, "eagle3_head", cfg, quantization)
    norm = draft.norm if cfg.layout == "canonical" else draft.final_norm
    g.head(draft, g.norm("hidden", norm, "final_norm"), "logits")
    head = _save(
        g, w, "eagle3_head", [_info("hidden", _F, ["B", "T", H])], [_info("logits", _F, ["B", "T", N])], out_dir
    )
    return [fc, step, head]


def build_dflash_graphs(draft, out_dir: Path, quantization: str = "none") -> list[Path]:
    """dflash_context / dflash_block for an attached DFlash draft (or the DFlash backbone of a DSpark one)."""
    cfg = draft.cfg
    if not isinstance(draft, DFlashDraft):
        raise ValueError(f"build_dflash_graphs takes a DFlash or DSpark draft, not {cfg.algo}")
    _check(cfg)
    H, N, nkv, hd, L, γ = (
        cfg.hidden_size,
        cfg.out_vocab_size,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.num_layers,
        cfg.block_size,
    )

    g, w = _new(out_dir, "dflash_context", cfg, quantization)
    ctx = g.norm(g.dense("features", draft.fc, "fc"), draft.context_norm, "context_norm")
    cos, sin = g.rope_tables("positions")
    outputs = []
    for i, layer in enumerate(draft.layers):
        k, v = g.key_value(layer.attn, ctx, cos, sin, f"layers.{i}.attn")
        g.op("Identity", [k], outputs=[f"context_key.{i}"])
        g.op("Identity", [v], outputs=[f"context_value.{i}"])
        outputs += [
            _info(f"context_key.{i}", _F, ["B", nkv, "T", hd]),
            _info(f"context_value.{i}", _F, ["B", nkv, "T", hd]),
        ]
    paths = [
        _save(
            g,
            w,
            "dflash_context",
            [_info("features", _F, ["B", "T", cfg.feature_size]), _info("positions", _I64, ["B", "T"])],
            outputs,
            out_dir,
        )
    ]

    g, w = _new(out_dir, "dflash_block", cfg, quantization)
    first = g.embed(draft, g.op("Unsqueeze", ["anchor", g.const("axes.1", np.array([1], np.int64))]))  # [B, 1, H]
    mask_rows = g.op(
        "Expand",
        [
            g.w.add("mask_embedding", _np(draft.mask_embedding)[None, None, :]),
            g.op(
                "Concat",
                [g.op("Shape", ["anchor"]), g.const("shape.mask_rows", np.array([γ - 1, H], np.int64))],
                axis=0,
            ),
        ],
    )
    h = g.op("Concat", [first, mask_rows], axis=1)  # block_input: [B, γ, H]
    cos, sin = g.rope_tables("positions")
    for i, layer in enumerate(draft.layers):
        p = f"layers.{i}"
        x = g.norm(h, layer.attn_norm, f"{p}.attn_norm")
        q = g.query(layer.attn, x, cos, sin, f"{p}.attn")
        k, v = g.key_value(layer.attn, x, cos, sin, f"{p}.attn")
        keys = g.op("Concat", [f"context_key.{i}", k], axis=2)
        values = g.op("Concat", [f"context_value.{i}", v], axis=2)
        h = g.op("Add", [h, g.attend(layer.attn, q, keys, values, "visible", f"{p}.attn")])
        h = g.op("Add", [h, g.mlp(g.norm(h, layer.mlp_norm, f"{p}.mlp_norm"), layer.mlp, f"{p}.mlp")])
    g.op("Identity", [g.norm(h, draft.final_norm, "final_norm")], outputs=["hidden"])
    g.head(draft, "hidden", "logits")
    inputs = [_info("anchor", _I64, ["B"]), _info("positions", _I64, ["B", γ])]
    for i in range(L):
        inputs += [
            _info(f"context_key.{i}", _F, ["B", nkv, "K", hd]),
            _info(f"context_value.{i}", _F, ["B", nkv, "K", hd]),
        ]
    inputs.append(_info("visible", _BOOL, ["B", γ, "KQ"]))
    paths.append(
        _save(
            g, w, "dflash_block", inputs, [_info("hidden", _F, ["B", γ, H]), _info("logits", _F, ["B", γ, N])], out_dir
        )
    )
    return paths


def build_dspark_graphs(draft, out_dir: Path, quantization: str = "none") -> list[Path]:
    """The DFlash backbone's graphs, then dspark_markov (the Markov and confidence heads) for an attached DSpark."""
    if not isinstance(draft, DSparkDraft):
        raise ValueError(f"build_dspark_graphs takes a DSpark draft, not {draft.cfg.algo}")
    paths = build_dflash_graphs(draft, out_dir, quantization)
    cfg = draft.cfg
    H, N = cfg.hidden_size, cfg.out_vocab_size
    g, w = _new(out_dir, "dspark_markov", cfg)
    m = g.op(
        "Gather",
        [
            g.w.add("markov_in.weight", _np(draft.markov_in.weight)),
            g.op("Gather", [g.w.add("t2d", draft.t2d.cpu().numpy().astype(np.int64)), "prev_tokens"]),
        ],
    )
    g.op(
        "Add",
        ["base_logits", g.op("MatMul", [m, g.w.add("markov_out.weight_t", _np(draft.markov_out.weight).T)])],
        outputs=["logits"],
    )
    conf = g.dense(g.op("Concat", ["hidden", m], axis=-1), draft.confidence, "confidence")  # [B, W, 1]
    g.op("Squeeze", [conf, g.axis_last], outputs=["confidence"])
    paths.append(
        _save(
            g,
            w,
            "dspark_markov",
            [
                _info("hidden", _F, ["B", "W", H]),
                _info("base_logits", _F, ["B", "W", N]),
                _info("prev_tokens", _I64, ["B", "W"]),
            ],
            [_info("logits", _F, ["B", "W", N]), _info("confidence", _F, ["B", "W"])],
            out_dir,
        )
    )
    return paths


def build_draft_graphs(draft, out_dir: Path, quantization: str = "none") -> list[Path]:
    """The graphs of a neural draft (attached, float32) into out_dir, by its algorithm's builder; returns their paths,
    in the order of the algorithm's `onnx.files`. `quantization`: the dense layers' and the head's weight format
    (DRAFT_QUANTIZATION says which the export picks)."""
    graphs = resolve_algorithm(draft.cfg.algo).onnx
    if graphs is None:
        raise ValueError(f"{draft.cfg.algo} drafts have no ONNX graphs")
    return load_part(graphs.build)(draft, out_dir, quantization)
