"""Drive a drafter outside the engine exactly as the engine does: its batch state written, its commit hooks called.

Replays that measure a draft's acceptance on held-out answers (training/corpus.py) and tests of a drafter alone
need the engine's side of the drafter contract without a target: a `BatchState` holding each slot's committed
tokens, and, for a KVDrafter, the reset / commit / move / release calls in the engine's order. `DraftDriver` is that
side and nothing more; SpecEngine remains the one place that decides what is committed.
"""

from __future__ import annotations

import torch

from deepspec.decoding.batch_state import BatchState, BatchView, new_sequence_id
from deepspec.decoding.drafter import Drafter, DraftSampling, KVDrafter, PaddedProposal, Proposal
from deepspec.decoding.params import SamplingParams


class DraftDriver:
    def __init__(self, drafter: Drafter, num_slots: int = 8, max_tokens: int = 4096, target=None):
        """`target`: bind the drafter to it (as the engine does before its first request); None = leave unbound."""
        self.drafter = drafter
        self.state = BatchState(num_slots, max_tokens)
        self._kv = drafter if isinstance(drafter, KVDrafter) else None
        if target is not None:
            drafter.bind(target, num_slots, max_tokens)

    @property
    def view(self) -> BatchView:
        return self.state.view

    def start(
        self, slot: int, tokens: list[int], features: torch.Tensor | None = None, params: SamplingParams | None = None
    ) -> None:
        """A new sequence in `slot` whose prompt + first token are `tokens`; features [1, len(tokens) - 1, F] are
        the target features before tokens[1:] (what a neural draft needs)."""
        self.state.admit(slot, new_sequence_id(), params or SamplingParams())
        self.state.append(slot, list(tokens))
        if self._kv is not None:
            self._kv.start(slot, list(tokens), features)

    def commit(self, slots: list[int], tokens: list[list[int]], features: torch.Tensor | None = None) -> None:
        """Each slot's newly committed tokens (accepted drafts + the target's next token); features
        [B, max len, F] aligned with them."""
        for slot, row in zip(slots, tokens):
            self.state.append(slot, list(row))
        if self._kv is not None:
            self._kv.commit_rows(slots, tokens, features)

    def propose(self, slots: list[int], k: int, sampling: DraftSampling | None = None) -> PaddedProposal:
        """The drafter's proposal for `slots` as the engine reads it: padded to k columns (greedy rows, global RNG,
        when `sampling` is None). `propose_ragged` is what the drafter returned."""
        return self.propose_ragged(slots, k, sampling).padded(k)

    def propose_ragged(self, slots: list[int], k: int, sampling: DraftSampling | None = None) -> Proposal:
        if sampling is None:
            sampling = DraftSampling(torch.zeros(len(slots)), [None] * len(slots))
        return self.drafter.propose(self.state.view, list(slots), k, sampling)

    def move(self, src: int, dst: int) -> None:
        self.state.move(src, dst)
        if self._kv is not None:
            self._kv.move_slot(src, dst)

    def release(self, slot: int) -> None:
        if self._kv is not None:
            self._kv.release(slot)
        self.state.clear(slot)
