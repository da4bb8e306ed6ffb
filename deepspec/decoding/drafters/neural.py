"""What the three trained drafters (Eagle3, DFlash, DSpark) share: binding a draft model to the engine's slots,
per-row sampling of draft tokens, and packing proposals. Each drafter keeps its own KV cache rows indexed by
engine slot, so `move_slot` is one row copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from deepspec.decoding.drafter import DraftSampling, Drafter, Proposal
from deepspec.models.target import Target

#: cache positions past max_seq_len: drafts of a row near its limit still have somewhere to go
CACHE_SLACK = 64


class NeuralDrafter(Drafter):
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
    def extend(self, slots, tokens, num_tokens, features) -> None:
        if features is None:
            raise ValueError(f"the {self.name} drafter needs target features: the engine must capture feature_layers")
        self._extend(slots, tokens, num_tokens, features)

    @torch.inference_mode()
    def propose(self, slots: list[int], k: int, sampling: DraftSampling) -> Proposal:
        if self.tree is not None:
            return self._propose_tree(slots, k, sampling)
        return self._propose_chain(slots, k, sampling)

    def _extend(self, slots: list[int], tokens: torch.Tensor, num_tokens: torch.Tensor, features: torch.Tensor) -> None:
        """Record the committed tokens and the target features before them (features is never None here)."""
        raise NotImplementedError

    def _propose_chain(self, slots: list[int], k: int, sampling: DraftSampling) -> Proposal:
        """Up to k draft tokens in a row per slot."""
        raise NotImplementedError

    def _propose_tree(self, slots: list[int], k: int, sampling: DraftSampling) -> Proposal:
        """A token tree of up to k nodes per slot, shaped by `self.tree`."""
        raise NotImplementedError


def checkpoint_loader(cls: type[Drafter]):
    """The registry's loader for a draft algorithm's directories: read the weights (checked against the target's
    fingerprint, attached to its embedding and head), then wrap them in `cls` (the algorithm's drafter class)."""

    def load(path: Path, header: dict, target: Target, **options) -> Drafter:
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


def pack(tokens: list[torch.Tensor], probs: list[torch.Tensor] | None, k: int, num: torch.Tensor,
         survival: list[torch.Tensor] | None = None) -> Proposal:
    """Stack per-slot columns into a Proposal of width k (pad with the last column / zero probs / zero survival)."""
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
        both = torch.cat([num[:, None].to(survival[0].device, torch.float32),
                          torch.stack(survival[:width], dim=1).float()], dim=1).cpu()
        num = both[:, 0].long()
        out_survival = torch.zeros(len(num), k)
        out_survival[:, :width] = both[:, 1:]
        out_survival[torch.arange(k)[None, :] >= num[:, None]] = 0.0
    return Proposal(out_tokens, num.cpu(), out_probs, out_survival)


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


@dataclass
class _Node:
    token: int  # draft-vocabulary id
    parent: int  # candidate index, -1 = root
    depth: int  # 1 = child of the root
    survival: float
    q: torch.Tensor | None  # [N] draft-vocab distribution the token was sampled from; None = chosen (one-hot)


def grow_tree(expand: Expander, max_depth: int, k: int, shape: TreeShape, sampling: DraftSampling, model,
              calibrate: Callable[[torch.Tensor, int], torch.Tensor] | None = None,
              threshold: float = 0.0) -> Proposal:
    """Grow each row's tree depth by depth and keep its k best nodes.

    Every expanded node gets `branches` children: the top tokens of its draft distribution (softmax at the row's
    temperature; at T = 1 for greedy rows). In a sampled row the first child is instead *drawn* from that
    distribution and carries it as q; its siblings stay deterministic (one-hot q) and skip the drawn token.
    Survival: without `calibrate` the cumulative draft probability (EAGLE-2; a drawn child counts as the top one,
    whose place it takes); with it (DSpark) the first child gets parent · c (the calibrated confidence that the
    step is accepted) and the others share parent · (1 - c) in proportion to their probability — so a node never
    outlives its parent and siblings never outlive it together. The `width` likeliest candidates of each depth
    are expanded next (one draft call per depth); finally the k candidates with the highest survival are kept
    (a parent always outranks its child, so the kept set is a tree), nodes under `threshold` dropped (the root's
    first child always kept), and numbered depth by depth, siblings likelier first."""
    logits, conf = expand(0, None, None)
    B = logits.shape[0]
    temps = sampling.temperature.tolist()
    generators = sampling.generators_on(logits.device) if any(t > 0 for t in temps) else None
    safe = torch.tensor([t if t > 0 else 1.0 for t in temps], dtype=torch.float32, device=logits.device)
    nodes: list[list[_Node]] = [[] for _ in range(B)]
    frontier = [[-1] for _ in range(B)]  # candidate index per expanded node (-1 = root)
    for depth in range(1, max_depth + 1):
        w = logits.shape[1]
        probs = torch.softmax(logits.float() / safe[:, None, None], dim=-1)  # [B, w, N]
        top_p, top_i = probs.topk(min(shape.branches + 1, probs.shape[-1]), dim=-1)
        c = calibrate(conf, depth - 1).tolist() if (calibrate is not None and conf is not None) else None
        top_p, top_i = top_p.tolist(), top_i.tolist()
        for b in range(B):
            for j in range(w):
                parent = frontier[b][j]
                parent_surv = 1.0 if parent < 0 else nodes[b][parent].survival
                children = [(t, p, None) for t, p in zip(top_i[b][j], top_p[b][j])]
                if temps[b] > 0:
                    drawn = int(torch.multinomial(probs[b, j], 1, generator=generators[b])[0])
                    children = [(drawn, float(probs[b, j, drawn]), probs[b, j])] + \
                        [ch for ch in children if ch[0] != drawn]
                children = children[: shape.branches]
                first_p = children[0][1]
                for i, (token, p, q) in enumerate(children):
                    if c is None:
                        surv = parent_surv * (top_p[b][j][0] if q is not None else p)
                    elif i == 0:
                        surv = parent_surv * c[b][j]
                    else:
                        surv = parent_surv * (1.0 - c[b][j]) * p / max(1.0 - first_p, 1e-9)
                    nodes[b].append(_Node(token, parent, depth, min(surv, parent_surv), q))
        if depth == max_depth:
            break
        # expand the `width` likeliest nodes of this depth (every row has as many: width <= candidates)
        expanded = frontier
        frontier = []
        for b in range(B):
            at_depth = [i for i, n in enumerate(nodes[b]) if n.depth == depth]
            at_depth.sort(key=lambda i: -nodes[b][i].survival)  # stable: creation order breaks ties
            frontier.append(at_depth[: shape.width])
        w_next = min(len(f) for f in frontier)
        frontier = [f[:w_next] for f in frontier]
        tokens = torch.tensor([[nodes[b][i].token for i in f] for b, f in enumerate(frontier)], dtype=torch.long)
        parent_slot = torch.tensor([[expanded[b].index(nodes[b][i].parent) for i in f] for b, f in enumerate(frontier)],
                                   dtype=torch.long)
        logits, conf = expand(depth, model.to_target_ids(tokens.to(model.d2t.device)), parent_slot)
    return _select(nodes, k, threshold, model, any(t > 0 for t in temps))


def _select(nodes: list[list[_Node]], k: int, threshold: float, model, with_probs: bool) -> Proposal:
    """Keep each row's k highest-survival candidates (parents before children) → a Proposal in target ids; its
    probs live on the draft's device, where the nodes' q were computed."""
    B = len(nodes)
    tokens = torch.zeros(B, k, dtype=torch.long)
    parents = torch.full((B, k), -1, dtype=torch.long)
    survival = torch.zeros(B, k)
    num = torch.zeros(B, dtype=torch.long)
    qs: list[list[torch.Tensor | None]] = []
    for b, row in enumerate(nodes):
        order = sorted(range(len(row)), key=lambda i: -row[i].survival)
        kept: list[int] = []
        chosen = set()
        for i in order:
            if len(kept) == k:
                break
            n = row[i]
            if (n.parent < 0 or n.parent in chosen) and (n.survival >= threshold or not kept):
                kept.append(i)
                chosen.add(i)
        kept.sort(key=lambda i: row[i].depth)  # stable: siblings stay likelier first
        index = {old: new for new, old in enumerate(kept)}
        for new, old in enumerate(kept):
            n = row[old]
            tokens[b, new] = n.token
            parents[b, new] = -1 if n.parent < 0 else index[n.parent]
            survival[b, new] = n.survival
        num[b] = len(kept)
        qs.append([row[old].q for old in kept])
    tokens = model.to_target_ids(tokens.to(model.d2t.device)).cpu()
    probs = None
    if with_probs:
        V = model.cfg.vocab_size
        device = model.d2t.device
        probs = torch.zeros(B, k, V, device=device)
        for b in range(B):
            for j in range(k):
                q = qs[b][j] if j < len(qs[b]) else None
                if q is not None:
                    probs[b, j] = model.scatter_probs(q.float().to(device)[None])[0]
                elif j < int(num[b]):
                    probs[b, j, tokens[b, j]] = 1.0
    return Proposal(tokens, num, probs, survival, parents)
