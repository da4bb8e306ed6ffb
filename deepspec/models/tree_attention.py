"""Tree attention: which keys each node of a token tree sees, and at which RoPE position it sits.

A verify pass over a token tree feeds T = 1 + nodes tokens per row: column 0 is the root (the row's last committed
token, not yet in the cache) and `parents[b, i]` (< i) the node that node i follows. All T entries are written to
the cache at start[b] + i (node index order), but node i must see only what a plain causal pass over its own
root-to-node path would: the committed keys 0 .. start[b]-1 and the entries of its ancestors and itself. Its
position is start[b] + depth(i) (the root has depth 0), so every path is scored exactly as the sequence it spells.
After verification the accepted path's entries are moved to consecutive positions (KVCache.keep_path).
"""

from __future__ import annotations

import math

import torch


def check_parents(parents: torch.Tensor) -> None:
    """ValueError unless parents [B, T] is a topologically ordered tree: parents[:, 0] = -1, 0 <= parents[:, i] < i."""
    if parents.dim() != 2 or parents.shape[1] < 1:
        raise ValueError(f"tree_parents must be [B, T] with T >= 1, got {list(parents.shape)}")
    T = parents.shape[1]
    idx = torch.arange(T, device=parents.device)
    ok = (parents[:, 0] == -1).all() & ((parents[:, 1:] >= 0) & (parents[:, 1:] < idx[None, 1:])).all()
    if not bool(ok):
        raise ValueError("tree_parents must have -1 at column 0 (the root) and 0 <= parents[b, i] < i after it")


def ancestors(parents: torch.Tensor) -> torch.Tensor:
    """parents [B, T] int64 → [B, T, T] bool: [b, i, j] = node j is node i or one of its ancestors.

    Starts from "self or parent" and squares the relation ceil(log2 T) times (boolean matrix products), so a tree of
    32 nodes costs 5 small batched matmuls instead of a Python loop over nodes."""
    B, T = parents.shape
    device = parents.device
    reach = torch.eye(T, device=device).expand(B, T, T).clone()
    rows = torch.arange(B, device=device)[:, None]
    child = torch.arange(1, T, device=device)[None, :]
    reach[rows, child, parents[:, 1:].clamp(min=0)] = 1.0
    for _ in range(math.ceil(math.log2(T))):
        reach = torch.bmm(reach, reach).clamp_(max=1.0)
    return reach > 0


def depths(ancestry: torch.Tensor) -> torch.Tensor:
    """[B, T, T] ancestor-or-self relation → [B, T] int64 depth of each node (root 0)."""
    return ancestry.sum(-1) - 1


def tree_visibility(
    ancestry: torch.Tensor,  # [B, T, T] bool from `ancestors`
    depth: torch.Tensor,  # [B, T] int64
    base: torch.Tensor,  # [B] int64: cache position of the root (= number of committed keys)
    num_keys: int,
    window: int = 0,
) -> torch.Tensor:
    """→ [B, T, K] bool: query node t of row b sees key k (a committed key k < base, or the entry of an ancestor-or-
    self node at base + j), within `window` positions of the node's own (0 = no window)."""
    B, T, _ = ancestry.shape
    key = torch.arange(num_keys, device=ancestry.device)
    rel = key[None, :] - base[:, None]  # [B, K]: key's node index when it lies in this row's tree
    in_tree = (rel >= 0) & (rel < T)
    node = rel.clamp(0, T - 1)
    visible = ancestry.gather(2, node[:, None, :].expand(B, T, num_keys)) & in_tree[:, None, :]
    visible = visible | (rel < 0)[:, None, :]
    if window:
        key_pos = torch.where(in_tree, base[:, None] + depth.gather(1, node), key[None, :])  # RoPE position of key
        query_pos = base[:, None] + depth
        visible = visible & (key_pos[:, None, :] > query_pos[:, :, None] - window)
    return visible
