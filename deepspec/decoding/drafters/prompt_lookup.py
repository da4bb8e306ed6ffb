"""Prompt lookup (n-gram) drafting: propose what followed the latest earlier occurrence of the current suffix.

Needs no training and no target features; strong wherever outputs copy their context (code edits, quoting
the prompt, repeated identifiers). The n-gram index is updated incrementally, so proposing costs a few dict
lookups whatever the context length.
"""

from __future__ import annotations

import torch

from deepspec.decoding.drafter import DraftSampling, Drafter, Proposal


class _History:
    def __init__(self, first_token: int, min_ngram: int, max_ngram: int):
        self.tokens = [first_token]
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        # n → {n-gram: end index of its latest occurrence}, never including the current suffix
        self.index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_ngram, max_ngram + 1)}

    def append(self, token: int) -> None:
        end = len(self.tokens) - 1  # the previous suffix becomes an "earlier occurrence" now
        for n in self.index:
            if end + 1 >= n:
                self.index[n][tuple(self.tokens[end - n + 1 : end + 1])] = end
        self.tokens.append(token)

    def propose(self, k: int) -> list[int]:
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(self.tokens) < n:
                continue
            end = self.index[n].get(tuple(self.tokens[-n:]))
            if end is not None:
                return self.tokens[end + 1 : end + 1 + k]
        return []


class PromptLookupDrafter(Drafter):
    name = "prompt-lookup"

    def __init__(self, min_ngram: int = 2, max_ngram: int = 4):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self._slots: dict[int, _History] = {}

    def reset(self, slot: int, first_token: int) -> None:
        self._slots[slot] = _History(first_token, self.min_ngram, self.max_ngram)

    def extend(self, slots, tokens, num_tokens, features) -> None:
        for row, slot in enumerate(slots):
            history = self._slots[slot]
            for token in tokens[row, : int(num_tokens[row])].tolist():
                history.append(token)

    def propose(self, slots: list[int], k: int, sampling: DraftSampling) -> Proposal:
        drafts = [self._slots[slot].propose(k) for slot in slots]
        tokens = torch.zeros(len(slots), k, dtype=torch.long)
        for row, draft in enumerate(drafts):
            if draft:
                tokens[row, : len(draft)] = torch.tensor(draft)
        return Proposal(tokens, torch.tensor([len(d) for d in drafts], dtype=torch.long), None)

    def move_slot(self, src: int, dst: int) -> None:
        self._slots[dst] = self._slots.pop(src)

    def release(self, slot: int) -> None:
        self._slots.pop(slot, None)
