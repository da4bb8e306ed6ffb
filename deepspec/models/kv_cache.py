"""Preallocated KV cache shared by all sequences of an engine; the `SlotCache` a `DecoderTarget` allocates.

One row ("slot") per running sequence. The engine keeps running sequences in slots 0..n-1, so a batched
forward reads `k[:, :n]` as a view. Verification writes k+1 positions past a row's length; rejecting drafts is
just not advancing that length (the stale entries are overwritten next round), so rollback costs nothing.
A verified token tree is the exception: its accepted path is scattered over the node positions, and `keep_path`
moves it next to the committed prefix before the length advances.
"""

from __future__ import annotations

import torch

import plugins
from deepspec.models.arch import ArchSpec


class KVCache:
    """k, v: [num_layers, num_slots, num_kv_heads, max_seq_len, head_dim] in the target's attention dtype."""

    def __init__(
        self, spec: ArchSpec, num_slots: int, max_seq_len: int, dtype: torch.dtype, device: torch.device | str = "cpu"
    ):
        shape = (spec.num_layers, num_slots, spec.num_kv_heads, max_seq_len, spec.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len

    def rows(self, first: int, count: int) -> KVCacheView:
        """A view of slots first..first+count-1 that a forward treats as rows 0..count-1 (no copy)."""
        return KVCacheView(self.k[:, first : first + count], self.v[:, first : first + count])

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Copy the first `length` positions of slot src into slot dst (compaction when a sequence leaves)."""
        self.k[:, dst, :, :length].copy_(self.k[:, src, :, :length])
        self.v[:, dst, :, :length].copy_(self.v[:, src, :, :length])

    def keep_path(self, start: torch.Tensor, path: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """After a tree verify pass over slots 0..B-1: move each row's accepted nodes to consecutive positions,
        entry start[b] + path[b, j] → start[b] + j for 1 <= j <= num_accepted[b] (the compact_kv op).

        start [B] int64: each row's root position; path [B, N] int64 and num_accepted [B] from tree_accept."""
        B = start.shape[0]
        plugins.compact_kv(self.k[:, :B], start, path, num_accepted)
        plugins.compact_kv(self.v[:, :B], start, path, num_accepted)

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2


class KVCacheView:
    def __init__(self, k: torch.Tensor, v: torch.Tensor):
        self.k = k
        self.v = v
