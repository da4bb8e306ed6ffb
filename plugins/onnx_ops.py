"""The ops as ONNX custom nodes, and ONNX Runtime kernels that run them on CPU.

Export: `plugins.ops.*` called inside `torch.onnx.export(..., dynamo=True)` emit one node per op through
`torch.onnx.ops.symbolic`, op_type = op name, domain `ai.onnx.contrib`, plus the attributes TensorRT's ONNX parser
binds a plugin by (plugin_namespace "deepspec", plugin_version "1", aot 1). An absent optional input
(draft_probs None) is a float tensor with 0 elements.

Run: `session_options()` registers Python kernels for every op with onnxruntime-extensions (they call the CPU
reference, so ORT and torch agree exactly) and returns SessionOptions that load its custom-op library:

    sess = onnxruntime.InferenceSession(path, plugins.onnx_ops.session_options(), providers=["CPUExecutionProvider"])

ONNX graphs carry float32 logits and caches (the kernels are registered for float32).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from plugins import reference
from plugins.schema import ONNX_DOMAIN, ONNX_DOMAIN_VERSION, OPS, TRT_ATTRIBUTES

_registered = False


def absent() -> torch.Tensor:
    """The stand-in for an optional input left out (ONNX nodes and TensorRT plugins take fixed inputs)."""
    return torch.zeros(0, dtype=torch.float32)


def symbolic(
    op: str,
    inputs: list[torch.Tensor],
    *,
    B: int | None = None,
    shape: Sequence[int] | None = None,
    dtype: torch.dtype | None = None,
    attrs: dict[str, int | float] | None = None,
) -> Sequence[torch.Tensor]:
    """Emit the custom node of `op`; output shapes follow schema.OPS (ids [B], tensors like `shape`)."""
    dtypes: list[torch.dtype] = []
    shapes: list[list[int]] = []
    for name in OPS[op]:
        if name in ("num_accepted", "next_token", "num_kept"):
            if B is None:
                raise ValueError(f"symbolic('{op}'): output '{name}' has one entry per row: pass B=")
            dtypes.append(torch.int64)
            shapes.append([B])
            continue
        if shape is None:
            raise ValueError(f"symbolic('{op}'): output '{name}' is shaped like an input: pass shape=")
        dtypes.append(torch.int64 if name == "path" else dtype or torch.float32)  # else: probs, survival, cache
        shapes.append(list(shape))
    return torch.onnx.ops.symbolic_multi_out(
        f"{ONNX_DOMAIN}::{op}",
        inputs,
        {**TRT_ATTRIBUTES, **(attrs or {})},
        dtypes=dtypes,
        shapes=shapes,
        version=ONNX_DOMAIN_VERSION,
    )


# ---- ONNX Runtime kernels --------------------------------------------------------------------------------------
def _t(x):
    return torch.from_numpy(x.copy())


def _q(x):
    return None if x.size == 0 else _t(x)


def _np(*xs: torch.Tensor) -> np.ndarray | tuple[np.ndarray, ...]:
    if len(xs) == 1:
        return xs[0].numpy()
    return tuple(x.numpy() for x in xs)


def register_ort_kernels() -> None:
    """Register the Python kernels with onnxruntime-extensions (once per process)."""
    global _registered
    if _registered:
        return
    try:
        from onnxruntime_extensions import PyCustomOpDef, onnx_op
    except ImportError as exc:
        raise ImportError(
            "running deepspec custom ONNX nodes needs onnxruntime-extensions: pip install 'deepspec[plugins]'"
        ) from exc
    F32, I64 = PyCustomOpDef.dt_float, PyCustomOpDef.dt_int64
    sampling = [F32, I64, F32, I64]  # temperature, top_k, top_p, seeds

    @onnx_op(op_type="greedy_accept", inputs=[I64, I64, F32], outputs=[I64, I64])
    def greedy_accept(draft_tokens, num_draft_tokens, target_logits):
        return _np(*reference.greedy_accept(_t(draft_tokens), _t(num_draft_tokens), _t(target_logits)))

    @onnx_op(op_type="rejection_sample", inputs=[I64, I64, F32, F32] + sampling, outputs=[I64, I64])
    def rejection_sample(draft_tokens, num, logits, q, temperature, top_k, top_p, seeds):
        return _np(
            *reference.rejection_sample(
                _t(draft_tokens), _t(num), _t(logits), _q(q), _t(temperature), _t(top_k), _t(top_p), _t(seeds)
            )
        )

    @onnx_op(op_type="process_logits", inputs=[F32, F32, I64, F32], outputs=[F32])
    def process_logits(logits, temperature, top_k, top_p):
        return _np(reference.process_logits(_t(logits), _t(temperature), _t(top_k), _t(top_p)))

    @onnx_op(op_type="tree_accept", inputs=[I64, I64, I64, F32, F32] + sampling, outputs=[I64, I64, I64])
    def tree_accept(tokens, parents, num_nodes, logits, q, temperature, top_k, top_p, seeds):
        return _np(
            *reference.tree_accept(
                _t(tokens),
                _t(parents),
                _t(num_nodes),
                _t(logits),
                _q(q),
                _t(temperature),
                _t(top_k),
                _t(top_p),
                _t(seeds),
            )
        )

    @onnx_op(op_type="compact_kv", inputs=[F32, I64, I64, I64], outputs=[F32])
    def compact_kv(cache, start, path, num_accepted):
        out = _t(cache)
        reference.compact_kv(out, _t(start), _t(path), _t(num_accepted))
        return _np(out)

    @onnx_op(op_type="confidence_truncate", inputs=[F32, I64], outputs=[I64, F32], attrs={"threshold": F32})
    def confidence_truncate(confidence, num_draft_tokens, threshold=0.0):
        return _np(*reference.confidence_truncate(_t(confidence), _t(num_draft_tokens), float(threshold)))

    _registered = True


def session_options():
    """onnxruntime.SessionOptions that run graphs containing the deepspec nodes on CPU."""
    import onnxruntime
    from onnxruntime_extensions import get_library_path

    register_ort_kernels()
    options = onnxruntime.SessionOptions()
    options.register_custom_ops_library(get_library_path())
    return options
