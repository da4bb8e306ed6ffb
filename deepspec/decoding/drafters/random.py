"""A deliberately bad drafter: uniformly random tokens. Tests use it to prove verification is lossless."""

from __future__ import annotations

import torch

from deepspec.decoding.drafter import DraftSampling, Drafter, Proposal


class RandomDrafter(Drafter):
    name = "random"

    def __init__(self, vocab_size: int, seed: int = 0, sample_probs: bool = False):
        self.vocab_size = vocab_size
        self.generator = torch.Generator().manual_seed(seed)
        #: return the uniform q with the drafts, exercising the residual path of rejection sampling
        self.sample_probs = sample_probs

    def reset(self, slot: int, first_token: int) -> None:
        pass

    def extend(self, slots, tokens, num_tokens, features) -> None:
        pass

    def propose(self, slots: list[int], k: int, sampling: DraftSampling) -> Proposal:
        B = len(slots)
        tokens = torch.randint(self.vocab_size, (B, k), generator=self.generator)
        num = torch.randint(0, k + 1, (B,), generator=self.generator)
        probs = torch.full((B, k, self.vocab_size), 1.0 / self.vocab_size) if self.sample_probs else None
        return Proposal(tokens, num, probs)

    def move_slot(self, src: int, dst: int) -> None:
        pass
