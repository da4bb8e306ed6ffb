"""Token-tree bookkeeping for the engine: drafter trees to verify-pass trees, budgets, and chains for chain targets.

A drafter's tree (deepspec/decoding/drafter.py) numbers its nodes 0..k-1 with `parents` -1 for the root (the
row's last committed token). The verify pass feeds the root too, so there the tree has T = 1 + k columns: column 0
is the root (parent -1) and node i of the drafter is column i + 1 (`with_root`). Everything here works on CPU
tensors of a whole batch; trees are small (k <= a few dozen), so a loop over nodes is cheap where one is needed.
"""

from __future__ import annotations

import torch

from deepspec.decoding.drafter import Proposal
from deepspec.models.tree_attention import ancestors


def chain_parents(batch: int, k: int) -> torch.Tensor:
    """[B, k] parents of a chain: -1, 0, 1, ..., k-2."""
    return torch.arange(-1, k - 1, dtype=torch.long).expand(batch, k).clone()


def with_root(parents: torch.Tensor, num_nodes: torch.Tensor) -> torch.Tensor:
    """Drafter parents [B, k] (-1 = root) → verify-pass parents [B, 1 + k] with the root as column 0. Nodes past
    num_nodes[b] hang off the root, so the padded columns are a valid tree whatever the drafter left there."""
    B, k = parents.shape
    live = torch.arange(k)[None, :] < num_nodes[:, None]
    shifted = torch.where(live, parents.long() + 1, torch.zeros_like(parents, dtype=torch.long))
    return torch.cat([torch.full((B, 1), -1, dtype=torch.long), shifted], dim=1)


def node_depths(parents: torch.Tensor, num_nodes: torch.Tensor) -> torch.Tensor:
    """Drafter parents [B, k] → [B, k] depth of each node (a child of the root has depth 1)."""
    full = with_root(parents, num_nodes)
    return (ancestors(full).sum(-1) - 1)[:, 1:]


def monotone_survival(survival: torch.Tensor, parents: torch.Tensor, num_nodes: torch.Tensor) -> torch.Tensor:
    """survival [B, k] → the same capped so no node survives more often than its parent (the minimum over the
    node's ancestors-or-self), 0 past num_nodes. A drafter's estimates may disagree with the tree shape; the
    budget's top-w cut is only ancestor-closed on a monotone score."""
    B, k = survival.shape
    anc = ancestors(with_root(parents, num_nodes))[:, 1:, 1:]  # [B, k, k] among the drafter's nodes
    s = survival.double()
    capped = torch.where(anc, s[:, None, :], torch.full_like(s[:, None, :], float("inf"))).amin(-1)
    live = torch.arange(k)[None, :] < num_nodes[:, None]
    return torch.where(live, capped, torch.zeros_like(capped))


def keep_nodes(proposal: Proposal, keep: torch.Tensor) -> Proposal:
    """The sub-tree of the nodes where keep [B, k] is True (an ancestor-closed set per row), renumbered in the
    original order, so parents still come first; num_tokens = kept count. Tensors on CPU."""
    B, k = proposal.tokens.shape
    count = keep.sum(1)
    width = int(count.max()) if B else 0
    index = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)[:, :width]  # kept nodes first, in order
    new_of_old = torch.cumsum(keep.long(), dim=1) - 1  # [B, k] new index of each kept node
    parents = proposal.parents.long() if proposal.parents is not None else chain_parents(B, k)
    parents = torch.where(keep, parents, torch.full_like(parents, -1))  # what a drafter left past its nodes
    old_parent = parents.gather(1, index)
    new_parent = torch.where(old_parent >= 0, new_of_old.gather(1, old_parent.clamp(min=0)), old_parent)
    live = torch.arange(width)[None, :] < count[:, None]
    new_parent = torch.where(live, new_parent, torch.full_like(new_parent, -1))
    probs = proposal.probs
    if probs is not None:
        probs = probs.gather(1, index.to(probs.device)[:, :, None].expand(-1, -1, probs.shape[2]))
    survival = proposal.survival.gather(1, index) if proposal.survival is not None else None
    return Proposal(proposal.tokens.gather(1, index), count, probs, survival, new_parent)


def first_children(proposal: Proposal) -> Proposal:
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
    chain = keep_nodes(Proposal(proposal.tokens.cpu(), num, proposal.probs,
                                proposal.survival.cpu() if proposal.survival is not None else None, parents),
                       on_chain)
    chain.parents = None
    return chain


def tree_survival_from_record(record: torch.Tensor, parents: torch.Tensor, num_nodes: torch.Tensor) -> torch.Tensor:
    """Survival for a drafter that gives none, from the sequence's record (verify_budget.observed_survival) [B, D]:
    record[b, d - 1] estimates P(the accepted path reaches depth d), and the nodes at depth d share it, halving
    with each later sibling at that depth (a drafter lists its likelier guesses first), so a wide level never
    claims more than the record says one path gains there."""
    B, k = parents.shape
    D = record.shape[1]
    live = torch.arange(k)[None, :] < num_nodes[:, None]
    depth = torch.where(live, node_depths(parents, num_nodes), torch.zeros(B, k, dtype=torch.long))
    same_level = (depth[:, :, None] == depth[:, None, :]) & live[:, None, :]  # [B, k, k]
    earlier = torch.ones(k, k, dtype=torch.bool).tril(-1)  # [i, j]: j < i
    rank = (same_level & earlier[None]).sum(-1)  # nodes listed before it at its depth
    weight = torch.pow(0.5, rank.double())
    level_total = (same_level.double() * weight[:, None, :]).sum(-1)  # [B, k] Σ weights at the node's depth
    reach = record.double().gather(1, (depth - 1).clamp(0, D - 1))
    return torch.where(live, reach * weight / level_total.clamp(min=1e-30), torch.zeros_like(reach))
