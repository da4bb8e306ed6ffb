"""Tree verification on CPU: the accepted root-to-leaf path of a token tree, and compacting its KV entries.

A tree is given per row by parent indices in topological order: node 0 is the root (the row's last committed
token, already fed), `parents[b, i] < i` for the other nodes, and the verify forward scored every node with
tree attention, so `target_logits[b, i]` is the target's distribution for the children of node i.

- Greedy rows (temperature <= 0): a node is accepted when its parent is and its token is the target's argmax
  after the parent; the path ends at the deepest accepted node (the lowest index among equals).
- Sampled rows: SpecInfer's multi-step rejection walk (arXiv 2305.09781). From the current node, its children
  are tried in index order; child x is accepted with probability min(1, r(x) / q(x)) where r starts as the
  processed p of the current node and, after each rejection, becomes normalize(max(0, r - q)) (q one-hot at a
  deterministic draft). An accepted child becomes the current node; when every child is rejected, the next
  token is drawn from r. This keeps the output distribution exactly the target's.

The path (node indices by depth) doubles as the gather index of `compact_kv`, which moves the accepted nodes'
KV entries to consecutive positions after the row's committed prefix.
"""

from __future__ import annotations

import torch

from plugins.reference.accept import sample_index
from plugins.reference.logits import process, scale
from plugins.reference.rng import uniforms


def tree_accept(
    tree_tokens: torch.Tensor,  # [B, N] int64, node 0 = root (its token is not checked)
    parents: torch.Tensor,  # [B, N] int64, -1 at the root, parents[b, i] < i
    num_nodes: torch.Tensor,  # [B] int64 in [1, N]: nodes past it are padding
    target_logits: torch.Tensor,  # [B, N, V] float: the target's distribution after each node
    draft_probs: torch.Tensor | None,  # [B, N, V] float: the q node i was drawn from (row 0 unused); None = one-hot
    temperature: torch.Tensor,  # [B] float32, <= 0 = greedy
    top_k: torch.Tensor,  # [B] int64
    top_p: torch.Tensor,  # [B] float32
    seeds: torch.Tensor,  # [B] int64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """→ (num_accepted [B], next_token [B], path [B, N]): path[b, j] is the accepted node at depth j
    (path[b, 0] = 0) for j <= num_accepted[b], and -1 after."""
    B, N, V = target_logits.shape
    ar = torch.arange(B, device=tree_tokens.device)
    valid = torch.arange(N, device=tree_tokens.device)[None, :] < num_nodes[:, None]
    parent = parents.clamp(min=0)
    greedy = temperature <= 0
    z = scale(target_logits.reshape(B * N, V), temperature.repeat_interleave(N))

    num_accepted = torch.zeros(B, dtype=torch.long, device=tree_tokens.device)
    next_token = torch.zeros(B, dtype=torch.long, device=tree_tokens.device)
    path = torch.full((B, N), -1, dtype=torch.long, device=tree_tokens.device)
    path[:, 0] = 0
    if bool(greedy.any()):
        argmax = z.view(B, N, V).argmax(dim=-1)  # [B, N]
        match = (tree_tokens == argmax.gather(1, parent)) & valid
        accepted = torch.zeros(B, N, dtype=torch.bool, device=tree_tokens.device)
        depth = torch.zeros(B, N, dtype=torch.long, device=tree_tokens.device)
        accepted[:, 0] = True
        for i in range(1, N):  # over nodes, vectorized over rows: a parent is always settled first
            accepted[:, i] = match[:, i] & accepted[ar, parent[:, i]]
            depth[:, i] = depth[ar, parent[:, i]] + 1
        best = torch.where(accepted, depth, torch.full_like(depth, -1)).argmax(dim=1)  # first deepest
        g_num, g_path = depth[ar, best], _path_to(best, depth[ar, best], parent)
        num_accepted = torch.where(greedy, g_num, num_accepted)
        next_token = torch.where(greedy, argmax[ar, best], next_token)
        path = torch.where(greedy[:, None], g_path, path)
    sampled = ~greedy
    if bool(sampled.any()):
        s_num, s_next, s_path = _sampled_walk(
            tree_tokens, parents, valid & sampled[:, None], z, draft_probs, top_k, top_p, seeds, B, N, V
        )
        num_accepted = torch.where(sampled, s_num, num_accepted)
        next_token = torch.where(sampled, s_next, next_token)
        path = torch.where(sampled[:, None], s_path, path)
    return num_accepted, next_token, path


def _path_to(node: torch.Tensor, depth: torch.Tensor, parent: torch.Tensor) -> torch.Tensor:
    """[B] end nodes and their depths → [B, N] node index per depth, -1 past the end."""
    B, N = parent.shape
    path = torch.full((B, N), -1, dtype=torch.long, device=node.device)
    ar = torch.arange(B, device=node.device)
    cur, d = node.clone(), depth.clone()
    for _ in range(N):
        live = d >= 0
        path[ar[live], d[live]] = cur[live]
        cur = parent[ar, cur]
        d = d - 1
    return path


def _node_probs(z, rows, i, top_k, top_p):
    """[len(rows), V] processed p after node i of the given rows. Only nodes a walk reaches are processed (the root
    and each accepted node): processing every node of every tree cost more than the rest of a sampled step."""
    return process(z[rows, i], top_k[rows], top_p[rows]).probs()


def _sampled_walk(tokens, parents, valid, z, draft_probs, top_k, top_p, seeds, B, N, V):
    z = z.view(B, N, V)
    ar = torch.arange(B, device=tokens.device)
    cur = torch.zeros(B, dtype=torch.long, device=tokens.device)
    depth = torch.zeros(B, dtype=torch.long, device=tokens.device)
    path = torch.full((B, N), -1, dtype=torch.long, device=tokens.device)
    path[:, 0] = 0
    residual = _node_probs(z, ar, 0, top_k, top_p)  # r: what the current node's next token is drawn from
    u = uniforms(seeds, 2 * torch.arange(N, device=tokens.device)[None, :].expand(B, N))
    for i in range(1, N):
        child = valid[:, i] & (parents[:, i] == cur)
        token = tokens[:, i]
        p_x = residual[ar, token]
        q = None if draft_probs is None else draft_probs[:, i].to(torch.float32)
        q_x = torch.ones_like(p_x) if q is None else q[ar, token]
        accept = child & (q_x > 0) & (u[:, i] * q_x < p_x)
        reject = child & ~accept
        if bool(reject.any()):  # only the rejecting rows' residuals change
            rows = reject.nonzero().squeeze(1)
            r = residual[rows]
            left = r.scatter(1, token[rows, None], 0.0) if q is None else (r - q[rows]).clamp_(min=0.0)
            total = left.sum(dim=-1, keepdim=True)
            residual[rows] = torch.where(total > 0, left / total.clamp(min=1e-30), r)
        if bool(accept.any()):
            cur = torch.where(accept, torch.full_like(cur, i), cur)
            depth = depth + accept.long()
            path[ar[accept], depth[accept]] = i
            rows = accept.nonzero().squeeze(1)
            residual[rows] = _node_probs(z, rows, i, top_k, top_p)
    next_token = sample_index(residual, uniforms(seeds, (2 * cur + 1)[:, None]).squeeze(1))
    return depth, next_token, path


def compact_kv(
    cache: torch.Tensor,  # [L, B, H, S, D], modified in place
    start: torch.Tensor,  # [B] int64: position of each row's root (its committed length before the tree)
    path: torch.Tensor,  # [B, N] int64 from tree_accept
    num_accepted: torch.Tensor,  # [B] int64 from tree_accept
) -> None:
    """Move the accepted nodes' entries to start + depth: cache[:, b, :, start + j] = cache[:, b, :, start +
    path[b, j]] for 1 <= j <= num_accepted[b]; every source is read before any destination is written."""
    N = path.shape[1]
    depth = torch.arange(N, device=cache.device)[None, :]
    src = start[:, None] + path.clamp(min=0)
    dst = start[:, None] + depth
    moves = (depth <= num_accepted[:, None]) & (path >= 0) & (src != dst)
    rows, cols = moves.nonzero(as_tuple=True)
    if rows.numel():
        cache[:, rows, :, dst[rows, cols]] = cache[:, rows, :, src[rows, cols]]
