"""Prompt lookup (n-gram) drafting: propose what followed the latest earlier occurrence of the current suffix.
Where its request has a session, the session's earlier answers are searched too, and the longer match drafts
(deepspec/decoding/session_memory.py).

Needs no training and no target features; strong wherever outputs copy their context (code edits, quoting
the prompt, repeated identifiers). It reads each sequence's tokens from the engine's batch state (BatchView) and
keeps only an n-gram index per sequence, keyed by the view's sequence id and caught up with the tokens committed
since the last call, so proposing costs a few dict lookups whatever the context length; the indexes of sequences
that have left the view are dropped when a new one arrives.
"""

from __future__ import annotations

import torch

from deepspec.decoding.batch_state import BatchView
from deepspec.decoding.drafter import Drafter, DraftSampling, Proposal, cumulative_counts


class NgramIndex:
    """Where each n-gram (min_ngram <= n <= max_ngram) of one sequence last ended, never counting the sequence's
    current suffix; the tokens themselves stay in the engine's batch state."""

    def __init__(self, min_ngram: int, max_ngram: int):
        #: tokens of the sequence seen so far: n-grams ending at 0 .. num_tokens - 2 are indexed
        self.num_tokens = 0
        # n → {n-gram: end index of its latest occurrence}
        self.index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_ngram, max_ngram + 1)}

    def catch_up(self, tokens: list[int], offset: int) -> None:
        """Index what `tokens` (the sequence from position `offset` on, its last token included) adds."""
        for end in range(max(self.num_tokens - 1, 0), offset + len(tokens) - 1):
            for n, table in self.index.items():
                if end + 1 >= n and end + 1 - n >= offset:
                    table[tuple(tokens[end + 1 - n - offset : end + 1 - offset])] = end
        self.num_tokens = offset + len(tokens)


class PromptLookupDrafter(Drafter):
    name = "prompt-lookup"

    def __init__(self, min_ngram: int = 2, max_ngram: int = 4):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        #: sequence id (BatchView.sequence_id) -> its n-gram index
        self._indexes: dict[int, NgramIndex] = {}
        #: the engine's session memory (`use_session_memory`), searched after the sequence itself
        self.session_memory = None

    def use_session_memory(self, memory) -> None:
        self.session_memory = memory

    def lookup(self, view: BatchView, slot: int, k: int) -> list[int]:
        """Prompt lookup's draft of up to k tokens for the slot's sequence, its index caught up first."""
        key = view.sequence_id(slot)
        index = self._indexes.get(key)
        tokens = view.tokens(slot)
        if index is None or index.num_tokens > len(tokens):
            self.forget_finished(view)  # a sequence is new: the indexes of those gone go
            index = self._indexes[key] = NgramIndex(self.min_ngram, self.max_ngram)
        # the tokens the new n-grams need: a window max_ngram back from the first one not yet indexed
        offset = max(0, index.num_tokens - self.max_ngram)
        index.catch_up(tokens[offset:].tolist(), offset)
        memory = self.session_memory
        session = view.session(slot) if memory is not None else None
        remembered = memory.match(session, tokens, k) if memory is not None and session is not None else (0, [])
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            end = index.index[n].get(tuple(tokens[-n:].tolist())) if len(tokens) >= n else None
            if end is not None and n >= remembered[0]:  # the longer match predicts better; a tie stays in context
                return tokens[end + 1 : end + 1 + k].tolist()
        return remembered[1]

    def forget_finished(self, view: BatchView) -> None:
        """Drop the indexes of sequences that no longer run."""
        live = view.live_sequence_ids()
        if any(key not in live for key in self._indexes):
            self._indexes = {key: index for key, index in self._indexes.items() if key in live}

    def propose(self, view: BatchView, slots: list[int], k: int, sampling: DraftSampling) -> Proposal:
        drafts = [self.lookup(view, slot, k) for slot in slots]
        return Proposal(torch.tensor([t for d in drafts for t in d], dtype=torch.long), cumulative_counts(drafts))
