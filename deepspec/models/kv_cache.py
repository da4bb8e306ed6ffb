"""Preallocated KV cache shared by all sequences of an engine; the `SlotCache` a `DecoderTarget` allocates.

One row ("slot") per running sequence. The engine keeps running sequences in slots 0..n-1, so a batched
forward reads `k[:, :n]` as a view. Verification writes k+1 positions past a row's length; rejecting drafts is
just not advancing that length (the stale entries are overwritten next round), so rollback costs nothing.
"""

from __future__ import annotations

import torch

from deepspec.models.arch import ArchSpec


class KVCache:
    """k, v: [num_layers, num_slots, num_kv_heads, max_seq_len, head_dim] in the target's attention dtype."""

    def __init__(self, spec: ArchSpec, num_slots: int, max_seq_len: int, dtype: torch.dtype, device="cpu"):
        shape = (spec.num_layers, num_slots, spec.num_kv_heads, max_seq_len, spec.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len

    def rows(self, first: int, count: int) -> "KVCacheView":
        """A view of slots first..first+count-1 that a forward treats as rows 0..count-1 (no copy)."""
        return KVCacheView(self.k[:, first : first + count], self.v[:, first : first + count])

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Copy the first `length` positions of slot src into slot dst (compaction when a sequence leaves)."""
        self.k[:, dst, :, :length].copy_(self.k[:, src, :, :length])
        self.v[:, dst, :, :length].copy_(self.v[:, src, :, :length])

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2


class KVCacheView:
    def __init__(self, k: torch.Tensor, v: torch.Tensor):
        self.k = k
        self.v = v
