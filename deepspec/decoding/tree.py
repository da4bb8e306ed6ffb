"""Token trees: the one form every drafter proposes, the one way a tree is pruned, and the engine's bookkeeping
(drafter trees to verify-pass trees, budgets, chains for chain targets).

A drafter's tree (deepspec/decoding/drafter.py) numbers its nodes 0..k-1 with `parents` -1 for the root (the
row's last committed token). The verify pass feeds the root too, so there the tree has T = 1 + k columns: column 0
is the root (parent -1) and node i of the drafter is column i + 1 (`with_root`).

Pruning (`keep_best_nodes`, and `top_nodes` under it) is shared by the neural drafters' trees (neural.grow_tree),
the hybrid's merge (`merge_trees`) and the verification budget (verify_budget.best_nodes): each row keeps its
likeliest nodes by survival, ties to the earlier node, so that a parent (never less likely than its child, and
numbered before it) is always kept before the child and the kept set stays a tree. Every function here is tensor
ops over a whole batch on the tensors' own device and reads nothing back, except `keep_nodes` and
`first_children`, which size their result on the host (the engine calls them on CPU tensors).
"""

from __future__ import annotations

import torch

from deepspec.decoding.drafter import PaddedProposal
from deepspec.models.tree_attention import ancestors


def chain_parents(batch: int, k: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[B, k] parents of a chain: -1, 0, 1, ..., k-2."""
    return torch.arange(-1, k - 1, dtype=torch.long, device=device).expand(batch, k).clone()


def live_nodes(num_nodes: torch.Tensor, k: int) -> torch.Tensor:
    """[B] node counts → [B, k] bool: node i is one of its row's nodes (i < num_nodes[b])."""
    return torch.arange(k, device=num_nodes.device)[None, :] < num_nodes[:, None]


def with_root(parents: torch.Tensor, num_nodes: torch.Tensor) -> torch.Tensor:
    """Drafter parents [B, k] (-1 = root) → verify-pass parents [B, 1 + k] with the root as column 0. Nodes past
    num_nodes[b] hang off the root, so the padded columns are a valid tree whatever the drafter left there."""
    B, k = parents.shape
    shifted = torch.where(live_nodes(num_nodes, k), parents.long() + 1, torch.zeros_like(parents, dtype=torch.long))
    return torch.cat([torch.full((B, 1), -1, dtype=torch.long, device=parents.device), shifted], dim=1)


def _ancestry(parents: torch.Tensor, num_nodes: torch.Tensor) -> torch.Tensor:
    """[B, k, k] bool among the drafter's nodes: [b, i, j] = node j is node i or one of its ancestors."""
    return ancestors(with_root(parents, num_nodes))[:, 1:, 1:]


def node_depths(parents: torch.Tensor, num_nodes: torch.Tensor) -> torch.Tensor:
    """Drafter parents [B, k] → [B, k] depth of each node (a child of the root has depth 1)."""
    return _ancestry(parents, num_nodes).sum(-1)


def _capped(survival: torch.Tensor, ancestry: torch.Tensor) -> torch.Tensor:
    """survival [B, k] → the minimum over each node's ancestors-or-self (ancestry [B, k, k]), as float64."""
    s = survival.double()
    return torch.where(ancestry, s[:, None, :], torch.full_like(s[:, None, :], float("inf"))).amin(-1)


def monotone_survival(survival: torch.Tensor, parents: torch.Tensor, num_nodes: torch.Tensor) -> torch.Tensor:
    """survival [B, k] → the same capped so no node survives more often than its parent (the minimum over the
    node's ancestors-or-self), 0 past num_nodes. A drafter's estimates may disagree with the tree shape; the
    budget's top-w cut is only ancestor-closed on a monotone score."""
    capped = _capped(survival, _ancestry(parents, num_nodes))
    return torch.where(live_nodes(num_nodes, survival.shape[1]), capped, torch.zeros_like(capped))


def _survival_rank(survival: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """[B, k] each node's place in its row by survival, highest first, ties to the earlier node; dead nodes last."""
    B, k = survival.shape
    score = torch.where(live, survival.double(), torch.full_like(survival, float("-inf"), dtype=torch.float64))
    order = score.sort(dim=1, descending=True, stable=True).indices
    return torch.empty_like(order).scatter_(1, order, torch.arange(k, device=order.device).expand(B, k))


def top_nodes(
    survival: torch.Tensor, live: torch.Tensor, width: int | torch.Tensor, threshold: float = 0.0
) -> torch.Tensor:
    """The pruning. survival [B, k], live [B, k] bool → keep [B, k] bool: each row's `width` live nodes of highest
    survival (ties: the earlier node; `width` one count, or [B, 1] counts row by row), those under `threshold`
    dropped except the row's best.

    Ancestor-closed when survival never grows from parent to child (monotone_survival makes any estimate so) and
    parents are numbered before their children: a parent then always ranks before its child."""
    rank = _survival_rank(survival, live)
    return live & (rank < width) & ((survival >= threshold) | (rank == 0))


def _renumber(
    keep: torch.Tensor, parents: torch.Tensor, order: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kept nodes (keep [B, k], ancestor-closed) in ascending `order` [B, k] (a parent's below its children's)
    as `width` columns → (index [B, width]: the old node of each new one, parents [B, width] renumbered, -1 past a
    row's count, count [B]). Columns past the count repeat a valid index."""
    B, k = keep.shape
    big = torch.iinfo(torch.long).max
    full = torch.where(keep, order.long(), torch.full_like(order, big, dtype=torch.long)).sort(dim=1, stable=True)
    position = torch.arange(k, device=keep.device).expand(B, k)
    new_of_old = torch.empty_like(position).scatter_(1, full.indices, position)
    index = full.indices[:, :width]
    if width > k:  # more columns than nodes: pad with node 0, past every count
        index = torch.cat([index, index.new_zeros(B, width - k)], dim=1)
    count = keep.sum(1)
    old_parent = torch.where(keep, parents.long(), torch.full_like(parents, -1, dtype=torch.long)).gather(1, index)
    new_parent = torch.where(old_parent >= 0, new_of_old.gather(1, old_parent.clamp(min=0)), old_parent)
    new_parent = torch.where(live_nodes(count, width), new_parent, torch.full_like(new_parent, -1))
    return index, new_parent, count


def keep_best_nodes(
    survival: torch.Tensor, parents: torch.Tensor, live: torch.Tensor, k: int, threshold: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's k likeliest nodes as a tree of its own. survival [B, M], parents [B, M] (-1 = root, every parent
    numbered before its children), live [B, M] bool (a node under a dead one is dead too) → (index [B, k]: the old
    node of each kept one, parents [B, k] renumbered, num [B]).

    Survival is first capped along each path (a node never outranks an ancestor), then `top_nodes` keeps the k best
    (nodes under `threshold` dropped, the row's best always kept), numbered depth by depth and, within a depth,
    likelier first: siblings are tried in index order, so the likelier one is tried first."""
    B, M = survival.shape
    ancestry = _ancestry(parents, torch.full((B,), M, dtype=torch.long, device=survival.device))
    live = live & ~(ancestry & ~live[:, None, :]).any(-1)
    capped = _capped(survival, ancestry)
    keep = top_nodes(capped, live, k, threshold)
    order = ancestry.sum(-1) * M + _survival_rank(capped, live)  # depth first, then rank
    return _renumber(keep, parents, order, k)


def gather_nodes(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values [B, M, ...] → [B, k, ...] at index [B, k] (a selection of `keep_best_nodes` or `_renumber`)."""
    index = index.to(values.device)
    return values.gather(
        1, index.view(*index.shape, *([1] * (values.dim() - 2))).expand(*index.shape, *values.shape[2:])
    )


def keep_nodes(proposal: PaddedProposal, keep: torch.Tensor) -> PaddedProposal:
    """The sub-tree of the nodes where keep [B, k] is True (an ancestor-closed set per row), renumbered in the
    original order, so parents still come first; num_tokens = kept count. Tensors on CPU."""
    B, k = proposal.tokens.shape
    width = int(keep.sum(1).max()) if B else 0
    parents = proposal.parents.long() if proposal.parents is not None else chain_parents(B, k)
    index, new_parent, count = _renumber(keep, parents, torch.arange(k).expand(B, k), width)
    probs = gather_nodes(proposal.probs, index) if proposal.probs is not None else None
    survival = gather_nodes(proposal.survival, index) if proposal.survival is not None else None
    return PaddedProposal(gather_nodes(proposal.tokens, index), count, probs, survival, new_parent)


def first_children(proposal: PaddedProposal) -> PaddedProposal:
    """A tree → the chain that starts at the root's first child and follows each node's first child: what a
    target without tree attention verifies. A chain comes back as it is."""
    if proposal.parents is None:
        return proposal
    parents, num = proposal.parents.cpu().long(), proposal.num_tokens.cpu()
    B, k = parents.shape
    on_chain = torch.zeros(B, k, dtype=torch.bool)
    taken = torch.zeros(B, k + 1, dtype=torch.bool)  # [b, 1 + p]: node p (or the root, p = -1) has its first child
    rows = torch.arange(B)
    for i in range(k):
        live = i < num
        p = torch.where(live, parents[:, i], torch.full_like(num, -1))
        parent_on_chain = (p < 0) | on_chain[rows, p.clamp(min=0)]
        first = ~taken[rows, p + 1] & live
        on_chain[:, i] = parent_on_chain & first
        taken[rows, p + 1] |= live
    chain = keep_nodes(
        PaddedProposal(
            proposal.tokens.cpu(),
            num,
            proposal.probs,
            proposal.survival.cpu() if proposal.survival is not None else None,
            parents,
        ),
        on_chain,
    )
    chain.parents = None
    return chain


def merge_trees(a: PaddedProposal, b: PaddedProposal, k: int) -> PaddedProposal:
    """Two proposals' trees (a chain is a tree too) under one root, row by row → up to k nodes per row: nodes whose
    root paths spell the same tokens become one node, keeping the higher survival, then `keep_best_nodes`. Without
    survival on both sides, a's nodes outrank b's and earlier nodes later ones. CPU tensors; no probs: only
    deterministic (one-hot) drafts may be merged by value (deepspec/decoding/drafters/hybrid.py says why)."""
    B, ka = a.tokens.shape
    kb = b.tokens.shape[1]
    M = ka + kb
    tokens = torch.cat([a.tokens, b.tokens], dim=1).long()
    pa = a.parents.long() if a.parents is not None else chain_parents(B, ka)
    pb = b.parents.long() if b.parents is not None else chain_parents(B, kb)
    live = torch.cat([live_nodes(a.num_tokens, ka), live_nodes(b.num_tokens, kb)], dim=1)
    parents = torch.where(live, torch.cat([pa, torch.where(pb >= 0, pb + ka, pb)], dim=1), -1)
    ancestry = _ancestry(parents, torch.full((B,), M, dtype=torch.long))
    # each node's root path as tokens by depth (column d - 1: its ancestor at depth d), -1 past its depth
    depth = torch.where(ancestry, ancestry.sum(-1)[:, None, :], 0)
    paths = torch.full((B, M, M + 1), -1, dtype=torch.long).scatter_(
        2, depth, torch.where(ancestry, tokens[:, None, :], -1)
    )[:, :, 1:]
    same = (paths[:, :, None, :] == paths[:, None, :, :]).all(-1) & live[:, :, None] & live[:, None, :]
    position = torch.arange(M).expand(B, M)
    first = torch.where(live, same.long().argmax(-1), position)  # argmax: the first node with that path
    if a.survival is not None and b.survival is not None:
        score = torch.cat([a.survival, b.survival], dim=1).double()
    else:
        score = (M - position).double() / M
    merged = torch.full((B, M), float("-inf"), dtype=torch.float64).scatter_reduce(1, first, score, "amax")
    index, new_parents, num = keep_best_nodes(
        merged, torch.where(parents >= 0, first.gather(1, parents.clamp(min=0)), -1), live & (first == position), k
    )
    survival = None
    if a.survival is not None and b.survival is not None:
        survival = torch.where(live_nodes(num, k), merged.gather(1, index), 0.0).float()
    return PaddedProposal(tokens.gather(1, index), num, None, survival, new_parents)


def tree_survival_from_record(record: torch.Tensor, parents: torch.Tensor, num_nodes: torch.Tensor) -> torch.Tensor:
    """Survival for a drafter that gives none, from the sequence's record (verify_budget.observed_survival) [B, D]:
    record[b, d - 1] estimates P(the accepted path reaches depth d), and the nodes at depth d share it, halving
    with each later sibling at that depth (a drafter lists its likelier guesses first), so a wide level never
    claims more than the record says one path gains there."""
    B, k = parents.shape
    D = record.shape[1]
    live = live_nodes(num_nodes, k)
    depth = torch.where(live, node_depths(parents, num_nodes), torch.zeros(B, k, dtype=torch.long))
    same_level = (depth[:, :, None] == depth[:, None, :]) & live[:, None, :]  # [B, k, k]
    earlier = torch.ones(k, k, dtype=torch.bool).tril(-1)  # [i, j]: j < i
    rank = (same_level & earlier[None]).sum(-1)  # nodes listed before it at its depth
    weight = torch.pow(0.5, rank.double())
    level_total = (same_level.double() * weight[:, None, :]).sum(-1)  # [B, k] Σ weights at the node's depth
    reach = record.double().gather(1, (depth - 1).clamp(0, D - 1))
    return torch.where(live, reach * weight / level_total.clamp(min=1e-30), torch.zeros_like(reach))
