"""Matmul weights laid out once for the CPU kernel that reads them, behind one call: `weight(x, bias)`.

- OneDNNWeight: a bf16 weight reordered once for oneDNN. On CPU in bf16, F.linear reorders the weight on every call,
  which costs ~2x at decode shapes. The kernel and the results are the same.
- Int4Weight: a GGUF's 4-bit blocks (deepspec/models/gguf_int4.py) packed for torch's int4 CPU kernel, with the
  dense oneDNN weight beside it for wide inputs.

Neither has autograd. `linear` falls back to F.linear on the dense weight whenever a gradient is needed, so a draft
in training never runs on a stale packed copy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from deepspec.models.gguf_int4 import GROUP_SIZE, Int4Blocks


class OneDNNWeight:
    def __init__(self, weight: torch.Tensor):
        self.data = torch.ops.mkldnn._reorder_linear_weight(weight, 1)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.data, bias, "none", [], "")


# torch's int4 CPU kernels, bound as torch._* and so left out of the names its stubs export
_int4_pack = torch._convert_weight_to_int4pack_for_cpu  # pyright: ignore[reportPrivateImportUsage]
_int4_matmul = torch._weight_int4pack_mm_for_cpu  # pyright: ignore[reportPrivateImportUsage]


class Int4Weight:
    """The int4 kernel reads 4x fewer bytes than bf16, but it dequantizes the weight again for every input row. On
    SmolLM2's 30 layers (2 cores, AVX2) it takes 4.1 / 5.0 / 6.8 / 11.8 / 25.9 ms at 1 / 2 / 4 / 8 / 16 rows,
    against 11.6 / 13.8 / 10.3 / 13.6 / 19.0 ms for oneDNN bf16. So a decode step (a few rows) runs 4-bit. A wide
    verify or prefill (more than MAX_ROWS rows) runs on the dense copy, when there is one."""

    #: the widest input (batch x tokens) that still runs on the int4 kernel
    MAX_ROWS = 8

    def __init__(self, blocks: Int4Blocks, dtype: torch.dtype, dense: OneDNNWeight | None = None):
        self.out_features, self.in_features = blocks.shape
        self.data = _int4_pack(blocks.codes.to(torch.int32), 1)
        self.scales_zeros = torch.stack([blocks.scale.t(), blocks.zero.t()], dim=-1).to(dtype).contiguous()
        self.dense = dense

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if self.dense is not None and flat.shape[0] > self.MAX_ROWS:
            return self.dense(x, bias)
        y = _int4_matmul(flat, self.data, GROUP_SIZE, self.scales_zeros)
        y = y.view(*x.shape[:-1], self.out_features)
        return y if bias is None else y + bias


def onednn_pays(weight: torch.Tensor) -> bool:
    """Whether a prepacked oneDNN layout beats F.linear for this weight (bf16 on CPU)."""
    return weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()


def onednn_pack(weight: torch.Tensor) -> OneDNNWeight | None:
    """The oneDNN layout where it pays, else None."""
    if not onednn_pays(weight):
        return None
    try:
        return OneDNNWeight(weight.detach())
    except (RuntimeError, AttributeError):  # a torch build without these ops: stay on F.linear
        return None


def int4_supported(device: torch.device | str) -> bool:
    return torch.device(device).type == "cpu" and hasattr(torch, "_weight_int4pack_mm_for_cpu")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed) -> torch.Tensor:
    """F.linear, or the packed weight's kernel when there is one and no gradient has to flow."""
    if packed is not None and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
        return packed(x, bias)
    return F.linear(x, weight, bias)
