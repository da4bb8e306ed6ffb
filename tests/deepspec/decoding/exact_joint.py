"""The exact joint distribution of a target's next three sampled tokens: the oracle of the chi-square tests.

A tiny target over a handful of tokens has few enough three-token continuations to enumerate. Each is scored by
the target itself after logits processing, so a sampler that draws the target's distribution (with or without
drafts, chains or trees) must match this joint.
"""

from __future__ import annotations

import torch

from plugins import process_logits


def exact_joint(
    target, prompt: list[int], vocab: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> dict[tuple[int, int, int], float]:
    """(a, b, c) → P(the next three tokens after `prompt` are a, b, c) under the processed target distribution."""

    def probs(ctx):
        logits = target.forward(torch.tensor([ctx]), torch.tensor([0])).logits[:, -1:]
        return process_logits(logits, torch.tensor([temperature]), torch.tensor([top_k]), torch.tensor([top_p]))[0, 0]

    joint = {}
    with torch.no_grad():
        p1 = probs(prompt)
        for a in range(vocab):
            p2 = probs(prompt + [a])
            for b in range(vocab):
                p3 = probs(prompt + [a, b])
                for c in range(vocab):
                    joint[(a, b, c)] = float(p1[a] * p2[b] * p3[c])
    return joint
