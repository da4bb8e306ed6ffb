"""The drafter contract: how any draft (prompt lookup, Eagle3, DFlash, DSpark, ...) plugs into the engine.

A drafter guesses the tokens that follow each sequence's last committed token; the engine verifies them with
one target pass. The engine owns every sequence's committed tokens (deepspec/decoding/batch_state.py) and hands
each `propose` call a read-only `BatchView` of them, so a drafter that only reads tokens (prompt lookup, corpus
lookup) keeps no per-slot state and is never told when sequences start, move or end:

    propose(view, [s, ...], k, sampling)   # -> Proposal(tokens [N], cu_num_tokens [B + 1], probs [N, V] | None)

A drafter with a KV cache of its own (the neural drafts) is a `KVDrafter`: it also hears, through `commit`,
exactly which tokens became committed and the target features that produced them, and it moves its cache rows
when the engine compacts its slots. Lifecycle of one sequence in slot s, for a KVDrafter:

    reset(s, first_token)                       # new sequence; first_token = prompt[0]
    commit([s], prompt[1:] + [y0], features)    # after prefill: y0 is the target's first generated token
    loop:
        commit([s, ...], committed, features)   # what was committed since the last commit: one or more rounds'
        propose(view, [s, ...], k, sampling)    # accepted drafts + the target's own next token
    release(s)

The engine tells a KVDrafter what was committed just before it next proposes, so several rounds the verification
budget did not draft may arrive in one commit: a drafter's state after one commit of m tokens must be its state
after the same m tokens committed in pieces.

The engine keeps running sequences in slots 0..n-1 so that a batched forward reads its caches as views; when a
sequence leaves, the last one is moved into the hole and a KVDrafter hears `move_slot(src, dst)`.

`features[b, j]` is the target's feature vector (the concatenated outputs of `feature_layers`) at the position
just *before* `tokens[b, j]`, i.e. the hidden state whose logits predicted that token. Eagle3 pairs them exactly
like that; prompt lookup ignores them.

Chains and trees. A proposal is a token tree per row (below in its padded form, `PaddedProposal`; a drafter returns it
ragged, `Proposal`, rows back to back): `tokens[b, i]` is node i, and `parents[b, i]` the node it follows (-1 = the
row's last committed token, the root; otherwise an earlier node, `parents[b, i] < i`, so the nodes are in topological
order). `parents=None` is the chain `[-1, 0, 1, ...]`, what every drafter proposed before trees. The target scores all
nodes in one forward with tree attention (each node sees the committed context and its own ancestors; its position is
the committed length + its depth), the longest accepted root-to-leaf path is committed, and the engine records it (and a
KVDrafter hears it through `commit`) exactly as for a chain. Siblings are tried in index order, so put the likelier
child first. `k` in `propose` is the node budget per row: a chain spends it on depth, a tree spreads it over branches. A
target that cannot run tree attention gets the chain of first children.

`probs[b, i]` is the distribution node i's token was drawn from, given its parent (siblings drawn from one
distribution share it): sampled verification accepts node i by p/q. Only a token actually *sampled* from q may
carry q; a token chosen deterministically (argmax, top-k siblings, the most frequent continuation) is one-hot,
which `probs=None` (or a one-hot row) says. `survival[b, i]` estimates P(node i and all its ancestors accepted);
the verification budget keeps the nodes with the highest survival, cut so that every kept node's parent is kept.
This tensor form is the only one a tree takes: deepspec/decoding/tree.py prunes (`keep_best_nodes`), merges and
renumbers it with tensor ops, for the drafters and the engine alike.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch

from deepspec.decoding.batch_state import BatchView
from deepspec.models.target import Target


@dataclass
class Proposal:
    """What a drafter returns: ragged, as vLLM's spec-decode metadata is. Row b's nodes are entries
    cu_num_tokens[b] .. cu_num_tokens[b + 1] - 1 of every flat field, so a row that drafts nothing costs nothing and
    the draft distributions are stored for the proposed tokens only. The engine pads it once, for the batched verify
    ops (`padded`); a drafter whose rows all draft k tokens (a neural chain) pays no copy either way."""

    #: [N] draft tokens (tree nodes) of every row in turn, on the device they were computed on (a neural chain's
    #: stay on the target's: the engine reads them back once, with the round's result)
    tokens: torch.Tensor
    #: [B + 1] int64 CPU: row b's nodes are tokens[cu_num_tokens[b] : cu_num_tokens[b + 1]]
    cu_num_tokens: torch.Tensor
    #: [N, V] the distribution each draft token was drawn from, for rejection sampling; None = every draft is
    #: deterministic (one-hot q), as for prompt lookup or argmax drafting. On the device it was computed on.
    probs: torch.Tensor | None = None
    #: [N] the drafter's estimate of P(node and all its ancestors accepted); None = the engine estimates it
    survival: torch.Tensor | None = None
    #: [N] int64 parent of each node within its row: -1 = the root, else an earlier node of the same row (its index
    #: in the row); None = every row is a chain
    parents: torch.Tensor | None = None

    @property
    def num_tokens(self) -> torch.Tensor:
        """[B] nodes per row (CPU)."""
        return self.cu_num_tokens.diff()

    @property
    def is_tree(self) -> bool:
        return self.parents is not None

    @classmethod
    def from_rows(
        cls,
        tokens: torch.Tensor,
        num_tokens: torch.Tensor,
        probs: torch.Tensor | None = None,
        survival: torch.Tensor | None = None,
        parents: torch.Tensor | None = None,
    ) -> Proposal:
        """The ragged proposal of row-padded fields (tokens [B, k], num_tokens [B] CPU, probs [B, k, V], survival
        and parents [B, k]): views where every row is full or there is one row, one gather otherwise."""
        B, k = tokens.shape
        num = num_tokens.cpu().long().clamp(0, k)
        cu = torch.cat([num.new_zeros(1), num.cumsum(0)])
        full = B == 1 or bool((num == k).all())
        # [N] flat positions of the real nodes; None = they are the first N
        index = None if full else (torch.arange(k) + k * torch.arange(B)[:, None])[torch.arange(k) < num[:, None]]

        def flat(x: torch.Tensor) -> torch.Tensor:
            x = x.reshape(B * k, *x.shape[2:])
            return x[: int(cu[-1])] if index is None else x[index.to(x.device)]

        return cls(
            flat(tokens), cu, _map_optional(flat, probs), _map_optional(flat, survival), _map_optional(flat, parents)
        )

    def padded(self, width: int | None = None) -> PaddedProposal:
        """The row-padded form the engine and tree.py work on, `width` columns (default: the longest row's count):
        tokens padded with 0, probs and survival with 0, parents with -1."""
        num = self.num_tokens
        B, longest = len(num), int(num.max()) if len(num) else 0
        width = longest if width is None else width
        if width < longest:
            raise ValueError(f"a proposal of {longest} nodes in a row does not fit {width} columns")
        if bool((num == width).all()):
            place = None  # every row is full: a reshape
        else:
            row = torch.repeat_interleave(torch.arange(B), num)
            place = (row, torch.arange(len(row)) - self.cu_num_tokens[:-1][row])  # (row, column) of each node

        def rows(x: torch.Tensor, fill: int) -> torch.Tensor:
            if place is None:
                return x.reshape(B, width, *x.shape[1:])
            out = torch.full((B, width, *x.shape[1:]), fill, dtype=x.dtype, device=x.device)
            out[place[0].to(x.device), place[1].to(x.device)] = x
            return out

        return PaddedProposal(
            rows(self.tokens, 0),
            num,
            _map_optional(lambda x: rows(x, 0), self.probs),
            _map_optional(lambda x: rows(x, 0), self.survival),
            _map_optional(lambda x: rows(x, -1), self.parents),
        )


def _map_optional(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor | None) -> torch.Tensor | None:
    """fn(x) for a proposal field that is there, None for one that is not (probs, survival, parents)."""
    return None if x is None else fn(x)


def cumulative_counts(rows: list) -> torch.Tensor:
    """[B + 1] int64 offsets of ragged rows (Proposal.cu_num_tokens) from each row's items."""
    return torch.tensor([0] + [len(r) for r in rows], dtype=torch.long).cumsum(0)


@dataclass
class PaddedProposal:
    """A proposal with its rows padded to one width: the form the batched verify ops, the verification budget and the
    tree functions (deepspec/decoding/tree.py) take. Drafters that build trees work in it and return `ragged()`."""

    #: [B, k] draft tokens (tree nodes), right-padded with any valid id past num_tokens
    tokens: torch.Tensor
    #: [B] how many of each row's nodes are real drafts (0..k), a CPU tensor (the engine sizes the verify pass by it)
    num_tokens: torch.Tensor
    #: [B, k, V] the distribution each draft token was drawn from; None = deterministic drafts (one-hot q)
    probs: torch.Tensor | None = None
    #: [B, k] P(node j and all its ancestors accepted), 0 past num_tokens; None = the engine estimates it
    survival: torch.Tensor | None = None
    #: [B, k] int64 parent of each node: -1 = the root (last committed token), else an earlier node index;
    #: None = a chain (node j follows node j-1). Entries past num_tokens are ignored.
    parents: torch.Tensor | None = None

    @property
    def is_tree(self) -> bool:
        return self.parents is not None

    def tree_parents(self) -> torch.Tensor:
        """[B, k] `parents` of a tree proposal; a chain (is_tree False) has none, which is a caller's bug."""
        if self.parents is None:
            raise ValueError("a chain proposal has no tree parents")
        return self.parents

    def ragged(self) -> Proposal:
        return Proposal.from_rows(self.tokens, self.num_tokens, self.probs, self.survival, self.parents)


@dataclass
class DraftSampling:
    """How the rows of one propose call are being sampled; drafts may ignore it and stay deterministic."""

    #: [B] temperature per row, 0 = greedy (a CPU tensor)
    temperature: torch.Tensor
    #: one CPU generator per row (None = global RNG), so seeded requests stay reproducible; for draws on the host
    generators: list[torch.Generator | None]
    #: the same rows' generators on the target's device, for draws there (torch draws a CUDA tensor only with a
    #: CUDA generator); None = the rows have only `generators` (a CPU target)
    device_generators: list[torch.Generator | None] | None = None

    @property
    def all_greedy(self) -> bool:
        return bool((self.temperature == 0).all())

    def generators_on(self, device: torch.device | str) -> list[torch.Generator | None]:
        """Each row's generator for a draw on `device`: `generators` on the CPU, `device_generators` elsewhere.
        ValueError when the rows have none of that device type."""
        device = torch.device(device)
        generators = (
            self.generators if device.type == "cpu" or self.device_generators is None else self.device_generators
        )
        for g in generators:
            if g is not None and g.device.type != device.type:
                raise ValueError(
                    f"a draft samples on {device} but its rows' generators live on {g.device}: give "
                    f"DraftSampling.device_generators on {device.type} (SpecEngine does)"
                )
        return generators


class Drafter(ABC):
    """Base class for drafts; subclasses are named after their strategy (PromptLookupDrafter, Eagle3Drafter)."""

    #: target layers whose residual outputs this drafter consumes; empty = it needs no target features
    feature_layers: tuple[int, ...] = ()
    #: registry name, reported in metrics and benchmark tables
    name: str = "drafter"

    def bind(self, target: Target, max_batch_size: int, max_seq_len: int) -> None:  # noqa: B027 - optional hook
        """Allocate what the drafter needs once, before the first request (called by the engine)."""

    @abstractmethod
    def propose(self, view: BatchView, slots: list[int], k: int, sampling: DraftSampling) -> Proposal:
        """Guess up to k tokens (a chain, or a tree of k nodes) that follow each slot's last committed token;
        `view` holds every slot's committed tokens (read-only)."""

    def use_session_memory(self, memory) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Draft from this engine's session memory too (session_memory.SessionMemory; called once by the engine).
        Ignored here: only drafters that match token sequences (prompt and corpus lookup) can use it."""

    def costly_rows(self, view: BatchView, slots: list[int]) -> int:
        """How many of these rows the next `propose` would run a model of its own for: what the engine prices with
        the drafter's probed propose time before it drafts (planner.BudgetPlanner.draft_width). 0 here: a drafter
        that reads tokens (prompt or corpus lookup) costs next to nothing beside a target pass; a neural draft counts
        every row, a hybrid the rows its corpus leaves to the neural part."""
        return 0


class KVDrafter(Drafter):
    """A drafter with per-slot state of its own (a draft KV cache, indexed by engine slot): it hears every commit
    with the target features before each token, and every slot move."""

    @abstractmethod
    def reset(self, slot: int, first_token: int) -> None:
        """Start a new sequence in `slot` whose first token is `first_token` (prompt[0])."""

    @abstractmethod
    def commit(
        self,
        slots: list[int],
        tokens: torch.Tensor,  # [B, m] newly committed tokens, right-padded
        num_tokens: torch.Tensor,  # [B] valid entries per row (>= 1)
        features: torch.Tensor | None,  # [B, m, F] target features before each token, or None
    ) -> None:
        """Record committed tokens (and the target features that predicted them)."""

    @abstractmethod
    def move_slot(self, src: int, dst: int) -> None:
        """The sequence in slot src now lives in slot dst (the engine keeps running sequences in 0..n-1)."""

    def release(self, slot: int) -> None:
        """Forget the sequence in `slot` (finished or aborted)."""

    # the engine's two ways in, shared with DraftDriver so a replay feeds a drafter exactly as the engine does
    def start(self, slot: int, tokens: list[int], features: torch.Tensor | None) -> None:
        """A new sequence in `slot` whose prompt + first generated token are `tokens`; features [1, len - 1, F]."""
        self.reset(slot, tokens[0])
        if len(tokens) > 1:
            self.commit([slot], torch.tensor([tokens[1:]], dtype=torch.long), torch.tensor([len(tokens) - 1]), features)

    def commit_rows(self, slots: list[int], rows: list[list[int]], features: torch.Tensor | None) -> None:
        """`commit` of per-slot token lists (right-padded here); features [B, >= longest row, F] are cut to fit."""
        width = max(len(row) for row in rows)
        tokens = torch.tensor([list(row) + [0] * (width - len(row)) for row in rows], dtype=torch.long)
        self.commit(
            list(slots),
            tokens,
            torch.tensor([len(row) for row in rows]),
            features[:, :width] if features is not None else None,
        )
