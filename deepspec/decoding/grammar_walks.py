"""A round's drafts walked through each constrained row's grammar: which drafts the grammar allows, and the token
masks the verify logits get, for chains and token trees alike.

A draft the grammar forbids can never be accepted, so it is cut before the target scores it (a chain keeps the prefix
before it, a tree loses the node and its subtree); each remaining position's logits are masked to what the grammar
allows in the state that position is scored in. Rows without a grammar are skipped at no cost.
"""

from __future__ import annotations

import torch

from deepspec.decoding.drafter import PaddedProposal
from deepspec.decoding.structured import RowGrammar, mask_logits_, restrict_draft_probs
from deepspec.decoding.tree import keep_nodes

#: row -> (allowed per node, bitmask of allowed tokens at the root and after each node)
Walks = dict[int, tuple[list[bool], torch.Tensor]]


def walk_rows(
    grammars: list[RowGrammar | None], tokens: torch.Tensor, num: torch.Tensor, parents: torch.Tensor | None
) -> Walks:
    """Per constrained row, its proposal (tokens [B, k], num [B], parents [B, k] or None for chains) walked through
    its grammar (structured.RowGrammar.walk). Unconstrained rows are absent."""
    walks: Walks = {}
    if all(grammar is None for grammar in grammars):
        return walks
    tokens = tokens.cpu()  # walking a grammar is host work: one read of the drafts, constrained rounds only
    for row, grammar in enumerate(grammars):
        if grammar is None:
            continue
        n = int(num[row])
        row_parents = parents[row, :n].tolist() if parents is not None else list(range(-1, n - 1))
        walks[row] = grammar.walk(tokens[row, :n].tolist(), row_parents)
    return walks


def cut_tree(grammars: list[RowGrammar | None], proposal: PaddedProposal) -> tuple[PaddedProposal, Walks]:
    """The proposal's trees with the nodes their row's grammar forbids cut, with their subtrees, and the walks of
    what stays."""
    walks = walk_rows(grammars, proposal.tokens, proposal.num_tokens, proposal.parents)
    if any(not all(kept) for kept, _ in walks.values()):
        keep = torch.arange(proposal.tokens.shape[1])[None, :] < proposal.num_tokens[:, None]
        for row, (kept, _) in walks.items():
            keep[row, : len(kept)] = torch.tensor(kept, dtype=torch.bool)
        proposal = keep_nodes(proposal, keep)
        walks = walk_rows(grammars, proposal.tokens, proposal.num_tokens, proposal.parents)
    return proposal, walks


def cut_chains(
    walks: Walks, draft_tokens: torch.Tensor, num_drafts: torch.Tensor, draft_probs: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A draft the grammar forbids ends its chain: each constrained row's count (num_drafts [B], changed in place) is
    cut to its allowed prefix, and the drafts [B, k] (and their q [B, k, V]) to the longest count left."""
    for row, (kept, _) in walks.items():
        num_drafts[row] = kept.index(False) if False in kept else len(kept)
    k = int(num_drafts.max()) if len(num_drafts) else 0
    return draft_tokens[:, :k], draft_probs[:, :k] if draft_probs is not None and k else None


def mask_chains(
    walks: Walks, logits: torch.Tensor, num_drafts: torch.Tensor, draft_probs: torch.Tensor | None
) -> torch.Tensor | None:
    """Position j of a chain is scored in the state after its first j drafts: mask each constrained row's logits
    [B, k + 1, V] (in place) and restrict its drafts' q to what the grammar allows; → the (copied) q."""
    draft_probs = draft_probs.clone() if draft_probs is not None else None
    for row, (_, bitmask) in walks.items():
        n = int(num_drafts[row])
        mask_logits_(logits[row, : n + 1], bitmask[: n + 1])
        if draft_probs is not None and n:
            draft_probs[row, :n] = restrict_draft_probs(draft_probs[row, :n], bitmask[:n])
    return draft_probs


def mask_trees(
    walks: Walks, logits: torch.Tensor, num: torch.Tensor, q: torch.Tensor | None, tree_parents: torch.Tensor
) -> None:
    """Column c of a tree is scored after node c, and a node is drawn after its parent: mask each constrained row's
    logits [B, 1 + k, V] by the state after each node, and restrict its nodes' q [B, 1 + k, V] (column 0 the root's)
    by their parents' state; both in place. tree_parents [B, 1 + k]."""
    for row, (_, bitmask) in walks.items():
        n = int(num[row])
        mask_logits_(logits[row, : n + 1], bitmask)
        if q is not None and n:
            q[row, 1 : n + 1] = restrict_draft_probs(q[row, 1 : n + 1], bitmask[tree_parents[row, 1 : n + 1]])
