"""A deliberately bad drafter: uniformly random tokens. Tests use it to prove verification is lossless.

With `tree=True` it proposes random token trees instead of chains (each node's parent uniform over the root and
the earlier nodes), which exercises tree attention, the accepted-path choice and KV compaction on every shape.
With `sample_probs=True` each draft really is sampled from the q it returns: the uniform distribution for a chain,
and for a tree a random distribution per node (so sampled verification meets q that are far from uniform).
"""

from __future__ import annotations

import torch

from deepspec.decoding.batch_state import BatchView
from deepspec.decoding.drafter import Drafter, DraftSampling, Proposal


class RandomDrafter(Drafter):
    name = "random"

    def __init__(self, vocab_size: int, seed: int = 0, sample_probs: bool = False, tree: bool = False):
        self.vocab_size = vocab_size
        self.generator = torch.Generator().manual_seed(seed)
        #: return the q each draft was sampled from, exercising the residual path of rejection sampling
        self.sample_probs = sample_probs
        #: propose random trees of k nodes instead of chains
        self.tree = tree

    def propose(self, view: BatchView, slots: list[int], k: int, sampling: DraftSampling) -> Proposal:
        if self.tree:
            return self._propose_tree(len(slots), k)
        B = len(slots)
        tokens = torch.randint(self.vocab_size, (B, k), generator=self.generator)
        num = torch.randint(0, k + 1, (B,), generator=self.generator)
        probs = torch.full((B, k, self.vocab_size), 1.0 / self.vocab_size) if self.sample_probs else None
        return Proposal.from_rows(tokens, num, probs)

    def _propose_tree(self, B: int, k: int) -> Proposal:
        g = self.generator
        num = torch.randint(0, k + 1, (B,), generator=g)
        # parent of node i uniform over -1 (the root) .. i-1
        parents = (torch.rand(B, k, generator=g) * torch.arange(1, k + 1)).long() - 1
        if not self.sample_probs:
            return Proposal.from_rows(torch.randint(self.vocab_size, (B, k), generator=g), num, parents=parents)
        probs = torch.softmax(2.0 * torch.randn(B, k, self.vocab_size, generator=g), dim=-1)
        tokens = (
            torch.multinomial(probs.view(B * k, -1), 1, generator=g).view(B, k)
            if k
            else probs.new_zeros(B, 0, dtype=torch.long)
        )
        return Proposal.from_rows(tokens, num, probs, parents=parents)
