"""Speculative-verification ops for every runtime DeepSpec exports to: one op set, four implementations.

    torch.ops.deepspec.<op>        CPU reference (vectorized torch) / CUDA Triton kernels / fake for export
    ONNX node ai.onnx.contrib::<op>  run on CPU by ONNX Runtime through onnxruntime-extensions (plugins.onnx_ops)
    TensorRT plugin deepspec::<op>   the Triton kernels compiled ahead of time to PTX (plugins.tensorrt)

Ops: greedy_accept, rejection_sample, process_logits, tree_accept, compact_kv, confidence_truncate (see
plugins/README.md). Callers use the functions of `plugins.ops`, which also emit the ONNX nodes during
`torch.onnx.export`. `python -m plugins build` compiles the kernels to PTX/cubin without a GPU;
`python -m plugins check` compares the kernels with the reference on a GPU. This package imports nothing from
deepspec: the decoding engine depends on it, not the other way round.
"""

from plugins import library as _library  # noqa: F401 - registers torch.ops.deepspec.*
from plugins.ops import (
    compact_kv,
    confidence_truncate,
    greedy_accept,
    greedy_accept_host,
    process_logits,
    rejection_sample,
    rejection_sample_host,
    tree_accept,
)

__all__ = [
    "compact_kv",
    "confidence_truncate",
    "greedy_accept",
    "greedy_accept_host",
    "process_logits",
    "rejection_sample",
    "rejection_sample_host",
    "tree_accept",
]
