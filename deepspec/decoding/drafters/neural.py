"""What the three trained drafters (Eagle3, DFlash, DSpark) share: binding a draft model to the engine's slots,
per-row sampling of draft tokens, packing proposals and growing token trees (`grow_tree`, tensors on the draft's
device, pruned by tree.keep_best_nodes). Each drafter keeps its own KV cache rows indexed by engine slot, so
`move_slot` is one row copy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from deepspec.decoding.batch_state import BatchView
from deepspec.decoding.drafter import DraftSampling, KVDrafter, PaddedProposal, Proposal
from deepspec.decoding.tree import gather_nodes, keep_best_nodes, live_nodes
from deepspec.models.target import Target

#: cache positions past max_seq_len: drafts of a row near its limit still have somewhere to go
CACHE_SLACK = 64


class NeuralDrafter(KVDrafter):
    def __init__(self, model, tree_branches: int = 0, tree_width: int | None = None):
        """tree_branches = 0: propose a chain; >= 1: a tree (TreeShape) with that many children per expanded node
        and `tree_width` (default: tree_branches) nodes expanded per depth."""
        self.model = model
        self.cfg = model.cfg
        self.feature_layers = tuple(model.cfg.feature_layers)
        self.max_batch_size = 0
        self.tree = TreeShape(tree_branches, tree_width or tree_branches) if tree_branches else None

    def _check_target(self, target: Target) -> None:
        from deepspec.models.drafts.checkpoint import check_target

        check_target(self.cfg, target, where=f"{self.name} draft")

    def _new_cache(self, num_slots: int, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        p = next(self.model.parameters())
        shape = (num_slots, self.cfg.num_kv_heads, max_len + CACHE_SLACK, self.cfg.head_dim)
        return torch.zeros(shape, dtype=p.dtype, device=p.device), torch.zeros(shape, dtype=p.dtype, device=p.device)

    # The engine's two per-round calls, the same for every neural draft: a trained draft reads the target's features
    # (refused without them), and it grows a chain or, with `tree_branches` set, a token tree. Each drafter writes
    # the three steps below.
    @torch.inference_mode()
    def commit(self, slots, tokens, num_tokens, features) -> None:
        if features is None:
            raise ValueError(f"the {self.name} drafter needs target features: the engine must capture feature_layers")
        self._commit(slots, tokens, num_tokens, features)

    def costly_rows(self, view: BatchView, slots: list[int]) -> int:
        """Every row: each draft token is a forward of the draft model."""
        return len(slots)

    @torch.inference_mode()
    def propose(self, view: BatchView, slots: list[int], k: int, sampling: DraftSampling) -> Proposal:
        # built row-padded (every row drafts alike), handed over ragged: a view when every row is full
        if self.tree is not None:
            return self._propose_tree(slots, k, sampling).ragged()
        return self._propose_chain(slots, k, sampling).ragged()

    @property
    def tree_shape(self) -> TreeShape:
        """The tree `_propose_tree` grows; `propose` calls it only for a draft built with tree_branches."""
        if self.tree is None:
            raise ValueError(f"the {self.name} drafter was built without tree_branches: it proposes chains")
        return self.tree

    def _commit(self, slots: list[int], tokens: torch.Tensor, num_tokens: torch.Tensor, features: torch.Tensor) -> None:
        """Record the committed tokens and the target features before them (features is never None here)."""
        raise NotImplementedError

    def _propose_chain(self, slots: list[int], k: int, sampling: DraftSampling) -> PaddedProposal:
        """Up to k draft tokens in a row per slot."""
        raise NotImplementedError

    def _propose_tree(self, slots: list[int], k: int, sampling: DraftSampling) -> PaddedProposal:
        """A token tree of up to k nodes per slot, shaped by `self.tree`."""
        raise NotImplementedError


def checkpoint_loader(cls: type[NeuralDrafter]) -> Callable[..., NeuralDrafter]:
    """The registry's loader for a draft algorithm's directories: read the weights (checked against the target's
    fingerprint, attached to its embedding and head), then wrap them in `cls` (the algorithm's drafter class)."""

    def load(path: Path, header: dict, target: Target, **options) -> NeuralDrafter:
        from deepspec.models.drafts import load_draft

        return cls(load_draft(path, target), **options)

    return load


def pick_tokens(logits: torch.Tensor, sampling: DraftSampling, model, want_probs: bool):
    """logits [B, N] over the draft vocabulary → (target ids [B], probs [B, V] | None).

    Greedy rows take the argmax; sampled rows draw from softmax(logits / T) with their own generator, on the
    logits' device. The returned probs are that exact distribution scattered onto the target vocabulary
    (rejection sampling's q)."""
    temps = sampling.temperature.to(logits.device, torch.float32)
    ids = logits.argmax(dim=-1)
    probs = None
    if want_probs:
        safe = torch.where(temps > 0, temps, torch.ones_like(temps))
        draft_probs = torch.softmax(logits / safe[:, None], dim=-1)
        generators = sampling.generators_on(logits.device)
        for row, temperature in enumerate(sampling.temperature.tolist()):
            if temperature > 0:
                ids[row] = torch.multinomial(draft_probs[row], 1, generator=generators[row])[0]
        probs = model.scatter_probs(draft_probs)
    return model.to_target_ids(ids), probs


def pack(
    tokens: list[torch.Tensor],
    probs: list[torch.Tensor] | None,
    k: int,
    num: torch.Tensor,
    survival: list[torch.Tensor] | None = None,
) -> PaddedProposal:
    """Stack per-slot columns into a PaddedProposal of width k (pad with the last column / zero probs / zero
    survival)."""
    cols = tokens[:k]
    while len(cols) < k:
        cols.append(cols[-1])
    out_tokens = torch.stack(cols, dim=1)  # on the draft's device: the engine reads it back with the round's result
    out_probs = None
    if probs is not None:
        p = probs[:k]
        while len(p) < k:
            p.append(torch.zeros_like(p[-1]))
        out_probs = torch.stack(p, dim=1)
    out_survival = None
    num = num.clamp(max=k)
    if survival is not None:  # the verify budget reads them on the host: count and survival in one read
        width = min(len(survival), k)
        both = torch.cat(
            [num[:, None].to(survival[0].device, torch.float32), torch.stack(survival[:width], dim=1).float()], dim=1
        ).cpu()
        num = both[:, 0].long()
        out_survival = torch.zeros(len(num), k)
        out_survival[:, :width] = both[:, 1:]
        out_survival[torch.arange(k)[None, :] >= num[:, None]] = 0.0
    return PaddedProposal(out_tokens, num.cpu(), out_probs, out_survival)


# ---- token trees (EAGLE-2's dynamic tree, arXiv 2406.16858) -------------------------------------------------------
#: Expander(depth, tokens [B, w], parent_slot [B, w]) → (logits [B, w, N], confidence logits [B, w] | None): the
#: draft distribution over the children of each frontier node at `depth` (depth 0 = the root alone, w = 1, tokens
#: and parent_slot None); parent_slot[b, j] is the node's parent's place in the previous frontier.
Expander = Callable[[int, torch.Tensor | None, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor | None]]


@dataclass
class TreeShape:
    """How wide a draft tree grows: `branches` children per expanded node, `width` nodes expanded per depth."""

    branches: int = 4
    width: int = 4

    def __post_init__(self):
        if self.branches < 1 or self.width < 1:
            raise ValueError(f"tree branches and width must be >= 1, got {self.branches} and {self.width}")


def grow_tree(
    expand: Expander,
    max_depth: int,
    k: int,
    shape: TreeShape,
    sampling: DraftSampling,
    model,
    calibrate: Callable[[torch.Tensor, int], torch.Tensor] | None = None,
    threshold: float = 0.0,
) -> PaddedProposal:
    """Grow each row's tree depth by depth and keep its k best nodes.

    Every expanded node gets `branches` children: the top tokens of its draft distribution (softmax at the row's
    temperature; at T = 1 for greedy rows). In a sampled row the first child is instead *drawn* from that
    distribution and carries it as q; its siblings stay deterministic (one-hot q) and skip the drawn token.
    Survival: without `calibrate` the cumulative draft probability (EAGLE-2; a drawn child counts as the top one,
    whose place it takes); with it (DSpark) the first child gets parent · c (the calibrated confidence that the
    step is accepted) and the others share parent · (1 - c) in proportion to their probability — so a node never
    outlives its parent and siblings never outlive it together. The `width` likeliest candidates of each depth
    are expanded next (one draft call per depth); finally tree.keep_best_nodes keeps the k candidates with the
    highest survival (a tree), drops those under `threshold` (the best one always kept) and numbers them depth by
    depth, siblings likelier first.

    The candidates stay on the draft's device as tensors: growing reads nothing back, and the proposal's tokens,
    parents, count and survival come to the host in one read at the end (the engine needs them there). Sampled
    rows draw with their own generator, one draw per row and depth, so seeded rows replay whatever their batch."""
    logits, conf = expand(0, None, None)
    B, device = logits.shape[0], logits.device
    temps = sampling.temperature.tolist()
    sampled_rows = [b for b, t in enumerate(temps) if t > 0]
    generators = sampling.generators_on(device) if sampled_rows else None
    row_sampled = torch.tensor([t > 0 for t in temps], device=device)
    safe = torch.tensor([t if t > 0 else 1.0 for t in temps], dtype=torch.float32, device=device)
    levels: list[_Level] = []
    expanded = torch.full((B, 1), -1, dtype=torch.long, device=device)  # candidate index per expanded node, -1 root
    expanded_survival = torch.ones(B, 1, device=device)
    for depth in range(1, max_depth + 1):
        probs = torch.softmax(logits.float() / safe[:, None, None], dim=-1)  # [B, w, N]
        drawn = _draw(probs, sampled_rows, generators)
        confidence = calibrate(conf, depth - 1).float() if calibrate is not None and conf is not None else None
        level = _Level.grow(
            probs,
            drawn,
            row_sampled,
            shape.branches,
            expanded,
            expanded_survival,
            confidence,
            q_offset=sum(lv.num_q for lv in levels),
            keep_q=bool(sampled_rows),
        )
        levels.append(level)
        if depth == max_depth:
            break
        # expand the `width` likeliest candidates of this depth (ties: the earlier one)
        pick = level.survival.sort(dim=1, descending=True, stable=True).indices[:, : shape.width]  # [B, w']
        expanded = sum(lv.tokens.shape[1] for lv in levels[:-1]) + pick
        expanded_survival = level.survival.gather(1, pick)
        tokens = model.to_target_ids(level.tokens.gather(1, pick).to(model.d2t.device))
        logits, conf = expand(depth, tokens, pick // level.num_children)
    return _select(levels, k, threshold, model)


@dataclass
class _Level:
    """One depth's candidates, each expanded node's children side by side ([B, w * c], node j's at j*c .. j*c+c-1)."""

    tokens: torch.Tensor  # [B, M] draft-vocabulary ids
    parents: torch.Tensor  # [B, M] candidate index of the parent, -1 = the root
    survival: torch.Tensor  # [B, M]
    drawn: torch.Tensor  # [B, M] bool: sampled from q (the node's parent's distribution), else chosen (one-hot)
    q_slot: torch.Tensor  # [M] which of all depths' q rows (the expanded nodes' distributions) is the node's q
    q: torch.Tensor | None  # [B, w, N] this depth's distributions, kept when some row samples
    num_children: int

    @property
    def num_q(self) -> int:
        return self.q_slot.shape[0] // self.num_children

    @classmethod
    def grow(cls, probs, drawn, row_sampled, branches, expanded, expanded_survival, confidence, q_offset, keep_q):
        """The children of every expanded node: probs [B, w, N] their distributions, drawn [B, w] the token each
        sampled row drew there, expanded [B, w] / expanded_survival [B, w] the nodes' indices and survival."""
        B, w, N = probs.shape
        c = min(branches, N)
        top_p, top_i = probs.topk(min(branches + 1, N), dim=-1)  # one spare: a drawn token may be among them
        candidates = torch.cat([drawn[..., None], top_i], dim=-1)
        # sampled rows: the drawn token, then the top ones but it; greedy rows: the top ones
        skip = torch.cat(
            [~row_sampled[:, None, None].expand(B, w, 1), row_sampled[:, None, None] & (top_i == drawn[..., None])],
            dim=-1,
        )
        place = torch.argsort(skip.to(torch.int8), dim=-1, stable=True)[..., :c]
        tokens = candidates.gather(-1, place)  # [B, w, c]
        p = probs.gather(-1, tokens)
        is_drawn = place == 0
        if confidence is None:
            step = torch.where(is_drawn, top_p[..., :1], p)
        else:
            rest = (1.0 - confidence)[..., None] * p / (1.0 - p[..., :1]).clamp(min=1e-9)
            step = torch.cat([confidence[..., None], rest[..., 1:]], dim=-1)
        parent = expanded_survival[..., None]
        survival = torch.minimum(parent * step, parent)
        q_slot = q_offset + torch.arange(w, device=probs.device).repeat_interleave(c)
        return cls(
            tokens.flatten(1),
            expanded[..., None].expand(B, w, c).flatten(1),
            survival.flatten(1),
            is_drawn.flatten(1),
            q_slot,
            probs if keep_q else None,
            c,
        )


def _draw(probs: torch.Tensor, rows: list[int], generators) -> torch.Tensor:
    """[B, w] one token per expanded node of each sampled row, drawn from probs [B, w, N] with the row's own
    generator (on the probs' device: no read); other rows get 0."""
    drawn = torch.zeros(probs.shape[:2], dtype=torch.long, device=probs.device)
    for b in rows:
        drawn[b] = torch.multinomial(probs[b], 1, generator=generators[b])[:, 0]
    return drawn


def _joined(levels: list[_Level], field: str) -> torch.Tensor:
    """[B, M] one field of every depth's candidates, in candidate order."""
    return torch.cat([getattr(level, field) for level in levels], dim=1)


def _select(levels: list[_Level], k: int, threshold: float, model) -> PaddedProposal:
    """Keep each row's k best candidates (tree.keep_best_nodes) → a PaddedProposal in target ids: its tokens, parents,
    count and survival read to the host at once, its probs (when a row samples) left on the draft's device."""
    survival = _joined(levels, "survival")
    index, parents, num = keep_best_nodes(
        survival, _joined(levels, "parents"), torch.ones_like(survival, dtype=torch.bool), k, threshold
    )
    live = live_nodes(num, k)
    tokens = model.to_target_ids(gather_nodes(_joined(levels, "tokens"), index).to(model.d2t.device)).to(index.device)
    survival = torch.where(live, gather_nodes(survival, index), 0.0)
    probs = None
    if levels[0].q is not None:
        q_slot = torch.cat([lv.q_slot for lv in levels])[None].expand(len(num), -1)
        qs = [lv.q for lv in levels if lv.q is not None]
        assert len(qs) == len(levels)  # a level samples (has q) when the first one does
        q = model.scatter_probs(gather_nodes(torch.cat(qs, dim=1), q_slot.gather(1, index)))
        one_hot = torch.zeros_like(q).scatter_(2, tokens[..., None].to(q.device), 1.0)
        drawn = (gather_nodes(_joined(levels, "drawn"), index) & live).to(q.device)
        probs = torch.where(drawn[..., None], q, one_hot) * live.to(q.device)[..., None]
    # the one read of the round's tree: float64 holds every token id exactly
    host = torch.cat([num[:, None], tokens, parents, survival.double()], dim=1).double().cpu()
    return PaddedProposal(
        host[:, 1 : 1 + k].long(),
        host[:, 0].long(),
        probs,
        host[:, 1 + 2 * k :].float(),
        host[:, 1 + k : 1 + 2 * k].long(),
    )
