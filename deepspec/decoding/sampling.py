"""Turning target logits into the distribution p that sampling and rejection verification both use.

Temperature, top-k and top-p are applied per row (each request brings its own), identically for every
position of a verify block, so p at a draft slot is exactly what target-only sampling would draw from.
"""

from __future__ import annotations

import torch


def sampling_probs(
    logits: torch.Tensor,  # [B, T, V] float32
    temperature: torch.Tensor,  # [B] (> 0 for the rows that matter; 0 rows are returned as garbage)
    top_k: torch.Tensor,  # [B] int, 0 = off
    top_p: torch.Tensor,  # [B] float, 1 = off
) -> torch.Tensor:
    """Processed target distribution p: softmax(filter(logits / T)), [B, T, V]."""
    temp = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    scaled = logits / temp[:, None, None]
    if bool((top_k > 0).any()) or bool((top_p < 1).any()):
        scaled = _filter_top_k_top_p(scaled, top_k, top_p)
    return torch.softmax(scaled, dim=-1)


def _filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    V = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(V, device=logits.device)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, V))
    remove = rank[None, None, :] >= k[:, None, None]
    probs = torch.softmax(sorted_logits.masked_fill(remove, float("-inf")), dim=-1)
    # keep the smallest prefix whose mass reaches top_p (the token that crosses the line is kept)
    mass_before = probs.cumsum(dim=-1) - probs
    remove = remove | (mass_before >= top_p[:, None, None])
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from a [V] distribution."""
    return int(torch.multinomial(probs, 1, generator=generator))
