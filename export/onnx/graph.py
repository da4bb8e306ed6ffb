"""The target's decoder as one ONNX graph that ONNX Runtime runs for prefill and for multi-token verification.

Written node by node with `onnx.helper` from our lean decoder's weights (deepspec/models/decoder.py) rather than
traced: the graph computes what `Decoder.forward` computes, with the KV cache shaped the way the engine keeps it.

Inputs (B rows, T new tokens per row, S cache positions per slot, N logit positions per row):

    input_ids             int64 [B, T]
    seqlens_k             int32 [B]        start[b] + T - 1: the last position row b holds after this step
    total_sequence_length int32 []         max(start) + T
    logits_index          int64 [B, N]     positions (0..T-1) of each row whose logits to return; N = T for
                                           verification, 1 for the last prompt token, 0 for a prefill chunk
    past_key.{i}          float [B, nkv, S, hd]   layer i's cache rows (the engine's slots)
    past_value.{i}        float [B, nkv, S, hd]

Outputs:

    logits                float [B, N, V]
    features              float [B, T, len(feature_layers) * H]   residual outputs of the draft's layers
    present_key.{i}       float [B, nkv, S, hd]   = past_key.{i} with the T new entries written at start[b]..
    present_value.{i}

Attention is ONNX Runtime's `com.microsoft.GroupQueryAttention` with RoPE inside: bound to the same buffer as
its past input (IOBinding), its present output is the cache itself, updated in place: no copy of the context per
step, which at a few hundred tokens would cost as much as the 4-bit matmuls of a decode step. The kernel takes
several new tokens after a past only at B = 1; the runtime (deepspec/models/onnx_target.py) splits such a batch
into rows.

Linear layers are MatMul on fp32 weights, `com.microsoft.MatMulNBits` (4-bit blocks, one scale and zero point per
block, int8 activations: accuracy_level 4) for `quantization="int4"`, or `com.microsoft.MatMulIntegerToFloat` (int8
weights per output channel, uint8 activations quantized per row: `int8_linear`) for `quantization="int8"`. Every
linear's output row depends on its input row only, however many rows share the pass: what makes a verify pass
compute each token as a one-token step does (deepspec/models/onnx_target.py, "batch invariance"). With `fused` (the
default) the graph is written in ONNX Runtime's fused ops: SkipSimplifiedLayerNormalization adds the residual and
normalizes in one node, GroupQueryAttention reads the packed q|k|v projection, so a decode step launches ~10 kernels
per layer instead of ~13 (export/DESIGN.md, "ONNX Runtime", has the measurements). Weights go to one external data
file as they are produced, so the export never holds a second copy of the model in protobuf.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from deepspec.models.arch import ArchSpec
from deepspec.models.int8_weights import ACTIVATION_LEVELS, ACTIVATION_ZERO_POINT, quantize_int8

#: ONNX default-domain opset and the Microsoft contrib domain (GroupQueryAttention, MatMulNBits)
OPSET = 21
MS_DOMAIN = "com.microsoft"
#: weights per 4-bit block (the GGUF Q4 block size); see DESIGN.md "ONNX speed" for the measured alternatives
INT4_BLOCK = 32
#: block sizes MatMulNBits' CPU kernels take
INT4_BLOCKS = (16, 32, 64, 128, 256)
#: the op each weight format's linear layers run on
LINEAR_KERNELS = {"none": "MatMul", "int8": "MatMulIntegerToFloat", "int4": "MatMulNBits"}
#: families whose layers this graph describes; Gemma3 (sliding windows, two RoPE bases, sandwich norms) is not
SUPPORTED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


class UnsupportedTarget(ValueError):
    """The target's family has parts this graph does not describe."""


class _Weights:
    """Appends initializers to one external data file as they are made (aligned), returning slim TensorProtos."""

    def __init__(self, path: Path):
        self.path = path
        self.file = path.open("wb")
        self.offset = 0
        self.initializers: list[onnx.TensorProto] = []

    def add(self, name: str, array: np.ndarray) -> str:
        array = np.ascontiguousarray(array)
        if array.nbytes < 256:  # small constants stay inline
            tensor = onnx.numpy_helper.from_array(array, name)
        else:
            tensor = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype), dims=array.shape)
            pad = (-self.offset) % 64
            self.file.write(b"\0" * pad)
            self.offset += pad
            self.file.write(array.tobytes())
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (
                ("location", self.path.name),
                ("offset", str(self.offset)),
                ("length", str(array.nbytes)),
            ):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            self.offset += array.nbytes
        self.initializers.append(tensor)
        return name

    def close(self) -> None:
        self.file.close()


class _Builder:
    def __init__(self, weights: _Weights, block_size: int = INT4_BLOCK, accuracy_level: int = 4):
        self.w = weights
        self.block_size = block_size
        self.accuracy_level = accuracy_level
        self.nodes: list[onnx.NodeProto] = []
        self._count = 0
        self._consts: dict[str, str] = {}
        #: activation name → (its uint8 rows, their scales): int8 linears reading one input quantize it once
        self._row_quantized: dict[str, tuple[str, str]] = {}
        self._zero_points: dict[str, str] = {}  # int8_linear's `rows` → its uint8 zero points

    def op(self, op_type: str, inputs: list[str], outputs: list[str] | None = None, domain: str = "", **attrs) -> str:
        """One node with one output (named by `outputs`, else numbered); → that output's name."""
        (out,) = self.op_outputs(op_type, inputs, outputs=outputs, domain=domain, **attrs)
        return out

    def op_outputs(
        self,
        op_type: str,
        inputs: list[str],
        num_outputs: int = 1,
        outputs: list[str] | None = None,
        domain: str = "",
        **attrs,
    ) -> list[str]:
        """One node with several outputs (`outputs`, else `num_outputs` numbered ones); → their names in order."""
        self._count += 1
        outs = outputs or [f"{op_type.lower()}_{self._count}_{j}" for j in range(num_outputs)]
        self.nodes.append(
            helper.make_node(op_type, inputs, outs, name=f"{op_type}_{self._count}", domain=domain, **attrs)
        )
        return outs

    def const(self, name: str, value) -> str:
        """A named constant, added once however often it is asked for."""
        if name not in self._consts:
            self._consts[name] = self.w.add(name, np.asarray(value))
        return self._consts[name]

    def rms_norm(self, x: str, weight: np.ndarray, eps: float, name: str) -> str:
        """x / sqrt(mean(x²) + eps) * w over the last axis: the pattern ORT fuses into SimplifiedLayerNormalization."""
        w = self.w.add(name, weight.astype(np.float32))
        sq = self.op("Pow", [x, self.const(f"{name}.two", np.float32(2.0))])
        mean = self.op("ReduceMean", [sq, self.const(f"{name}.axes", np.array([-1], np.int64))], keepdims=1)
        rms = self.op("Sqrt", [self.op("Add", [mean, self.const(f"{name}.eps", np.float32(eps))])])
        return self.op("Mul", [self.op("Div", [x, rms]), w])

    def simplified_norm(self, x: str, weight: np.ndarray, eps: float, name: str) -> str:
        """RMSNorm as ONNX Runtime's SimplifiedLayerNormalization node (one kernel, float32 statistics)."""
        w = self.w.add(name, weight.astype(np.float32))
        return self.op("SimplifiedLayerNormalization", [x, w], axis=-1, epsilon=float(eps), stash_type=1)

    def skip_norm(self, x: str, delta: str, weight: np.ndarray, eps: float, name: str) -> tuple[str, str]:
        """(RMSNorm(x + delta), x + delta) in one SkipSimplifiedLayerNormalization: the residual add and the next
        norm share a pass over the row (and a kernel launch, which is most of a decode step's small ops)."""
        w = self.w.add(name, weight.astype(np.float32))
        self._count += 1
        outs = [f"{name}.out", "", "", f"{name}.sum"]
        self.nodes.append(
            helper.make_node(
                "SkipSimplifiedLayerNormalization",
                [x, delta, w],
                outs,
                name=f"SkipSimplifiedLayerNormalization_{self._count}",
                domain=MS_DOMAIN,
                epsilon=float(eps),
            )
        )
        return outs[0], outs[3]

    def linear(
        self, x: str, weight: np.ndarray, name: str, quantization: str, bias: np.ndarray | None = None, rows: str = ""
    ) -> str:
        """x [.., K] @ weight[N, K]ᵀ (+ bias): MatMul on fp32, int8_linear, or MatMulNBits on 4-bit blocks (the last
        block of a row zero-padded when K is not a multiple of the block size). rows: see int8_linear."""
        N, K = weight.shape
        if quantization == "int8":
            return self.int8_linear(x, weight, name, bias, rows)
        if quantization == "int4":
            packed, scales, zeros = quantize_int4(weight, self.block_size)
            inputs = [
                x,
                self.w.add(f"{name}.qweight", packed),
                self.w.add(f"{name}.scales", scales),
                self.w.add(f"{name}.zero_points", zeros),
            ]
            if bias is not None:
                inputs += ["", self.w.add(f"{name}.bias", bias.astype(np.float32))]  # g_idx unused
            # accuracy_level 4: activations quantized to int8 per block, the int8 dot-product kernels (0: float)
            return self.op(
                "MatMulNBits",
                inputs,
                domain=MS_DOMAIN,
                K=K,
                N=N,
                bits=4,
                block_size=self.block_size,
                accuracy_level=self.accuracy_level,
            )
        y = self.op("MatMul", [x, self.w.add(f"{name}.weight_t", weight.T.astype(np.float32))])
        if bias is not None:
            y = self.op("Add", [y, self.w.add(f"{name}.bias", bias.astype(np.float32))])
        return y

    def int8_linear(self, x: str, weight: np.ndarray, name: str, bias: np.ndarray | None = None, rows: str = "") -> str:
        """x @ weightᵀ on int8 weights (per output channel) and uint8 activations quantized per row.

        Why per row, not DynamicQuantizeMatMul's one scale per call: that scale is the max over every row of the
        call, so in a verify pass of T tokens each token's activations were rounded by what its neighbours held,
        and its logits differed from the same token's 1-token step (speculative greedy output drifted from the
        graph's own target-only output within 2-39 tokens). With a scale per row (its abs-max / 127, zero point
        128) a row's integers do not depend on the other rows, the integer dot products are exact and the scaling
        is per element, so the op's output row is bit-equal however many rows share the call.

        Nodes: Abs, ReduceMax and Mul give the row scales, a blocked QuantizeLinear (one block per row, opset 21)
        the uint8 rows, shared by every linear reading x; MatMulIntegerToFloat multiplies on MLAS's u8·s8 kernel and
        applies the weight scales per column and the row scales per row (its a_scale may be a tensor). `rows` names
        the leading shape x shares with other inputs, so their zero points [.., 1] are one tensor; an all-zero row
        has scale 0 and output 0·(finite) = 0."""
        if x not in self._row_quantized:
            row_scale = self.op(
                "Mul",
                [
                    self.op(
                        "ReduceMax",
                        [self.op("Abs", [x]), self.const("int8.axes", np.array([-1], np.int64))],
                        keepdims=1,
                    ),
                    self.const("int8.step", np.float32(1.0 / ACTIVATION_LEVELS)),
                ],
            )
            key = rows or x
            if key not in self._zero_points:
                self._zero_points[key] = self.op(
                    "Expand",
                    [self.const("int8.zero_point", np.uint8(ACTIVATION_ZERO_POINT)), self.op("Shape", [row_scale])],
                )
            quantized = self.op(
                "QuantizeLinear", [x, row_scale, self._zero_points[key]], axis=-1, block_size=weight.shape[1]
            )
            self._row_quantized[x] = (quantized, row_scale)
        quantized, row_scale = self._row_quantized[x]
        qweight, scales = quantize_int8(weight)
        y = self.op(
            "MatMulIntegerToFloat",
            [
                quantized,
                self.w.add(f"{name}.qweight_t", qweight.T),
                row_scale,
                self.w.add(f"{name}.scales", scales),
                self.const("int8.zero_point", np.uint8(ACTIVATION_ZERO_POINT)),
            ],
            domain=MS_DOMAIN,
        )
        if bias is not None:  # the op would scale its own bias input by the row scales: added after
            y = self.op("Add", [y, self.w.add(f"{name}.bias", bias.astype(np.float32))])
        return y


def quantize_int4(weight: np.ndarray, block_size: int = INT4_BLOCK) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """weight [N, K] float → MatMulNBits' (packed [N, nb, block/2] uint8, scales [N·nb] float32, zero points
    [N·ceil(nb/2)] uint8), nb = ceil(K / block): asymmetric round-to-nearest per block, ONNX Runtime's own packing
    kernel (which zero-pads a short last block).

    Why not the GGUF's own blocks: Q4_1's per-block offset is not an integer zero point, and MatMulNBits with float
    zero points leaves its int8 kernel for a path ~100x slower at batch 1 (measured: 26 ms vs 0.1 ms for a
    3072x576 matmul). Re-quantizing the dequantized file weights keeps the fast kernel; it adds a second rounding,
    at most half a step per weight."""
    # the compiled extension exports it (no stub): pyright cannot see the name
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits  # pyright: ignore[reportAttributeAccessIssue]

    if block_size not in INT4_BLOCKS:
        raise ValueError(f"int4 block size must be one of {INT4_BLOCKS}, got {block_size}")
    N, K = weight.shape
    blocks = -(-K // block_size)
    packed = np.zeros((N, blocks, block_size // 2), dtype=np.uint8)
    scales = np.zeros((N, blocks), dtype=np.float32)
    zeros = np.zeros((N, (blocks + 1) // 2), dtype=np.uint8)
    quantize_matmul_4bits(
        packed, np.ascontiguousarray(weight.T, dtype=np.float32), scales, zeros, block_size, N, K, False
    )
    return packed, scales.reshape(-1), zeros.reshape(-1)


def check_supported(spec: ArchSpec) -> None:
    if spec.family not in SUPPORTED_FAMILIES or spec.sliding_windows or spec.sandwich_norms or spec.gemma_norms:
        raise UnsupportedTarget(
            f"the ONNX export describes {', '.join(SUPPORTED_FAMILIES)} decoders; '{spec.family}' needs sliding-window "
            "layers, two RoPE bases and sandwich norms it does not have yet: export it with --format pytorch"
        )
    if spec.head_dim % 16:
        raise UnsupportedTarget(
            f"ONNX Runtime's GroupQueryAttention needs head_dim % 16 == 0 (this target: {spec.head_dim})"
        )


def build_target_graph(
    model,
    feature_layers: tuple[int, ...],
    out_dir: Path,
    quantization: str = "none",
    graph_name: str = "target.onnx",
    advance=lambda n=1: None,
    *,
    block_size: int = INT4_BLOCK,
    fused: bool = True,
    accuracy_level: int = 4,
) -> Path:
    """Write `graph_name` (+ its `.data` weights) for a `Decoder` into out_dir; returns the graph's path.
    `advance()` is called once per decoder layer written (a progress bar).

    block_size: weights per 4-bit block (int4 only); accuracy_level: MatMulNBits' compute type (4 = int8
    activations, 0 = float). fused: emit ONNX Runtime's fused nodes directly
    (SkipSimplifiedLayerNormalization for residual add + RMSNorm, packed q|k|v into GroupQueryAttention) instead of
    the plain-op pattern; fewer kernel launches per decode step, same numbers (bench.onnx_decode --designs)."""
    spec: ArchSpec = model.spec
    check_supported(spec)
    if quantization not in ("none", "int4", "int8"):
        raise ValueError(f"unknown ONNX quantization {quantization!r}; choose none, int4 or int8")
    weights = _Weights(out_dir / f"{graph_name}.data")
    g = _Builder(weights, block_size, accuracy_level)
    half = spec.head_dim // 2
    rope = (
        weights.add("rope.cos", _np(model.rope_cos)[:, :half]),  # [max_positions, hd/2]
        weights.add("rope.sin", -_np(model.rope_sin)[:, :half]),
    )  # sign of rotate_half is folded in our table
    embed = weights.add("embed.weight", _np(model.embed))
    x = g.op("Gather", [embed, "input_ids"])  # [B, T, H]
    if model.embed_scale != 1.0:
        x = g.op("Mul", [x, g.const("embed.scale", np.float32(model.embed_scale))])
    layers = _LayerWriter(g, spec, quantization, fused)

    stream = _ResidualStream(g, x, spec.rms_norm_eps, fused)
    captured: dict[int, str] = {}
    pending_capture: list[int] = []  # layers whose output is the next norm's input sum
    outputs_kv = []
    for i, layer in enumerate(model.layers):
        h = stream.norm(_np(layer.attn_norm), f"layers.{i}.attn_norm")
        captured.update({j: stream.residual for j in pending_capture})
        pending_capture = []
        attn, present = layers.attention(i, layer, h, rope)
        outputs_kv += present
        stream.delta = g.linear(attn, _np(layer.wo), f"layers.{i}.o", quantization, rows="tokens")
        stream.delta = layers.mlp(i, layer, stream.norm(_np(layer.mlp_norm), f"layers.{i}.mlp_norm"))
        if i in feature_layers:
            pending_capture.append(i)
        advance(1)
    x = stream.settle()
    captured.update({j: x for j in pending_capture})

    outputs = [_head_nodes(g, model, x, embed, quantization, fused)]
    if feature_layers:
        g.op("Concat", [captured[i] for i in feature_layers], outputs=["features"], axis=-1)
        outputs.append(
            helper.make_tensor_value_info(
                "features", TensorProto.FLOAT, ["B", "T", len(feature_layers) * spec.hidden_size]
            )
        )
    weights.close()
    return _save(g, weights, spec, outputs, outputs_kv, out_dir / graph_name)


def _np(t) -> np.ndarray:
    return t.detach().float().cpu().numpy()


class _ResidualStream:
    """The residual stream x = residual + delta; `delta` is None once it has been summed into `residual`. Fused,
    each norm is a SkipSimplifiedLayerNormalization that adds the pending delta and normalizes in one node."""

    def __init__(self, g: _Builder, x: str, eps: float, fused: bool):
        self.g, self.eps, self.fused = g, eps, fused
        self.residual: str = x
        self.delta: str | None = None

    def norm(self, weight: np.ndarray, name: str) -> str:
        g, eps = self.g, self.eps
        if self.delta is None:
            return (
                g.simplified_norm(self.residual, weight, eps, name)
                if self.fused
                else g.rms_norm(self.residual, weight, eps, name)
            )
        if self.fused:
            out, self.residual = g.skip_norm(self.residual, self.delta, weight, eps, name)
        else:
            self.residual = g.op("Add", [self.residual, self.delta])
            out = g.rms_norm(self.residual, weight, eps, name)
        self.delta = None
        return out

    def settle(self) -> str:
        """The residual stream as one tensor (adds a pending delta)."""
        if self.delta is not None:
            self.residual, self.delta = self.g.op("Add", [self.residual, self.delta]), None
        return self.residual


class _LayerWriter:
    """The nodes of one decoder layer's attention (GroupQueryAttention with RoPE inside, the KV cache as its
    past/present pair) and gated MLP, and the constants they share across layers."""

    def __init__(self, g: _Builder, spec: ArchSpec, quantization: str, fused: bool):
        self.g, self.spec, self.quantization, self.fused = g, spec, quantization, fused
        nh, nkv, hd = spec.num_heads, spec.num_kv_heads, spec.head_dim
        if spec.qk_norm:
            self.shape_q = g.const("shape.q", np.array([0, 0, nh, hd], np.int64))
            self.shape_kv = g.const("shape.kv", np.array([0, 0, nkv, hd], np.int64))
            self.shape_flat_q = g.const("shape.flat_q", np.array([0, 0, spec.q_size], np.int64))
            self.shape_flat_kv = g.const("shape.flat_kv", np.array([0, 0, spec.kv_size], np.int64))
        self.packed_qkv = fused and not spec.qk_norm  # GroupQueryAttention splits a packed q|k|v itself
        if not self.packed_qkv:
            self.split_qkv = g.const("split.qkv", np.array([spec.q_size, spec.kv_size, spec.kv_size], np.int64))
        inter = spec.intermediate_size
        self.split_mlp = g.const("split.mlp", np.array([inter, inter], np.int64))

    def attention(self, i: int, layer, h: str, rope: tuple[str, str]) -> tuple[str, list[str]]:
        """→ (the attention output before its projection, layer i's present key/value outputs)."""
        g, spec, p = self.g, self.spec, f"layers.{i}"
        bias = _np(layer.bqkv) if layer.bqkv is not None else None
        qkv = g.linear(h, _np(layer.wqkv), f"{p}.qkv", self.quantization, bias, rows="tokens")
        if self.packed_qkv:
            q, k, v = qkv, "", ""
        else:
            q, k, v = g.op_outputs("Split", [qkv, self.split_qkv], num_outputs=3, axis=-1)
        if spec.qk_norm:  # per-head RMSNorm before RoPE (Qwen3)
            q_norm = g.simplified_norm if self.fused else g.rms_norm
            eps = spec.rms_norm_eps
            q = g.op(
                "Reshape",
                [q_norm(g.op("Reshape", [q, self.shape_q]), _np(layer.q_norm), eps, f"{p}.q_norm"), self.shape_flat_q],
            )
            k = g.op(
                "Reshape",
                [
                    q_norm(g.op("Reshape", [k, self.shape_kv]), _np(layer.k_norm), eps, f"{p}.k_norm"),
                    self.shape_flat_kv,
                ],
            )
        present = [f"present_key.{i}", f"present_value.{i}"]
        attn = g.op_outputs(
            "GroupQueryAttention",
            [q, k, v, f"past_key.{i}", f"past_value.{i}", "seqlens_k", "total_sequence_length", *rope],
            outputs=[f"{p}.attn", *present],
            domain=MS_DOMAIN,
            num_heads=spec.num_heads,
            kv_num_heads=spec.num_kv_heads,
            scale=float(spec.attn_scale),
            do_rotary=1,
            rotary_interleaved=0,
        )[0]
        return attn, present

    def mlp(self, i: int, layer, h: str) -> str:
        g, p, quantization = self.g, f"layers.{i}", self.quantization
        gate_up = g.linear(h, _np(layer.w_gate_up), f"{p}.gate_up", quantization, rows="tokens")
        gate, up = g.op_outputs("Split", [gate_up, self.split_mlp], num_outputs=2, axis=-1)
        if self.spec.activation == "gelu_tanh":
            act = g.op("Gelu", [gate], approximate="tanh")
        else:
            act = g.op("Mul", [gate, g.op("Sigmoid", [gate])])
        return g.linear(g.op("Mul", [act, up]), _np(layer.w_down), f"{p}.down", quantization, rows="tokens")


def _head_nodes(g: _Builder, model, x: str, embed: str, quantization: str, fused: bool):
    """Logits only where asked: the rows' chosen positions gathered before the final norm and the head; → the
    `logits` output's value info."""
    spec = model.spec
    H = spec.hidden_size
    index = g.op(
        "Expand",
        [
            g.op("Unsqueeze", ["logits_index", g.const("axes.last", np.array([-1], np.int64))]),
            g.op("Concat", [g.op("Shape", ["logits_index"]), g.const("shape.hidden", np.array([H], np.int64))], axis=0),
        ],
    )
    picked = g.op("GatherElements", [x, index], axis=1)  # [B, N, H]
    hidden = (g.simplified_norm if fused else g.rms_norm)(
        picked, _np(model.final_norm), spec.rms_norm_eps, "final_norm"
    )
    if quantization in ("int4", "int8"):  # the head is the widest matmul of a small model: quantized too
        g.linear(hidden, _np(model.head), "lm_head", quantization)
        g.nodes[-1].output[0] = "logits"
    elif model.head is model.embed:  # Gemm with transB reads the embedding itself: no transposed copy of [V, H]
        flat = g.op("Reshape", [hidden, g.const("shape.rows", np.array([-1, H], np.int64))])
        rows = g.op("Gemm", [flat, embed], transB=1)
        g.op(
            "Reshape",
            [
                rows,
                g.op(
                    "Concat",
                    [g.op("Shape", ["logits_index"]), g.const("shape.vocab", np.array([spec.vocab_size], np.int64))],
                    axis=0,
                ),
            ],
            outputs=["logits"],
            allowzero=1,
        )  # N may be 0: no logits
    else:
        g.op("MatMul", [hidden, g.w.add("lm_head.weight_t", _np(model.head).T)], outputs=["logits"])
    return helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", "N", spec.vocab_size])


def _save(g: _Builder, weights: _Weights, spec: ArchSpec, outputs: list, outputs_kv: list[str], path: Path) -> Path:
    """The graph's inputs (module docstring) and the cache outputs around the nodes, saved as one model."""
    cache_dims = ["B", spec.num_kv_heads, "S", spec.head_dim]
    outputs = outputs + [helper.make_tensor_value_info(name, TensorProto.FLOAT, cache_dims) for name in outputs_kv]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", "T"]),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
        helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
        helper.make_tensor_value_info("logits_index", TensorProto.INT64, ["B", "N"]),
    ]
    for i in range(spec.num_layers):
        inputs += [
            helper.make_tensor_value_info(f"past_{kind}.{i}", TensorProto.FLOAT, cache_dims)
            for kind in ("key", "value")
        ]
    graph = helper.make_graph(g.nodes, "deepspec_target", inputs, outputs, initializer=weights.initializers)
    onnx_model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)],
        producer_name="deepspec-export",
    )
    onnx_model.ir_version = 10
    onnx.save_model(onnx_model, path)
    return path


def build_verify_graph(out_dir: Path, graph_name: str = "target.onnx", verify_name: str = "target_verify.onnx") -> Path:
    """The target graph ending in verification: input_ids = [last committed token, drafts], and the plugins'
    `greedy_accept` custom node turns the logits into (num_accepted [B], next_token [B]).

    It shares the target's weights file (same external-data location), so it costs a few hundred KB on disk. ONNX
    Runtime runs the node through onnxruntime-extensions (plugins/onnx_ops.py); TensorRT binds it to the plugin
    named by the node's attributes."""
    from plugins.schema import ONNX_DOMAIN, ONNX_DOMAIN_VERSION, TRT_ATTRIBUTES

    model = onnx.load(out_dir / graph_name, load_external_data=False)
    graph = model.graph
    starts, ends, axes = "verify.starts", "verify.ends", "verify.axes"
    graph.initializer.extend(
        [
            onnx.numpy_helper.from_array(np.array([1], np.int64), starts),
            onnx.numpy_helper.from_array(np.array([np.iinfo(np.int64).max], np.int64), ends),
            onnx.numpy_helper.from_array(np.array([1], np.int64), axes),
        ]
    )
    graph.node.extend(
        [
            helper.make_node("Slice", ["input_ids", starts, ends, axes], ["draft_tokens"], name="verify_drafts"),
            helper.make_node(
                "greedy_accept",
                ["draft_tokens", "num_draft_tokens", "logits"],
                ["num_accepted", "next_token"],
                name="verify_greedy_accept",
                domain=ONNX_DOMAIN,
                **TRT_ATTRIBUTES,
            ),
        ]
    )
    graph.input.append(helper.make_tensor_value_info("num_draft_tokens", TensorProto.INT64, ["B"]))
    graph.output.extend(
        [helper.make_tensor_value_info(name, TensorProto.INT64, ["B"]) for name in ("num_accepted", "next_token")]
    )
    model.opset_import.append(helper.make_opsetid(ONNX_DOMAIN, ONNX_DOMAIN_VERSION))
    path = out_dir / verify_name
    onnx.save_model(model, path)
    return path
