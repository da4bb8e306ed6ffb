"""Turning target logits into the distribution p that sampling and rejection verification both use.

Temperature, top-k and top-p are applied per row (each request brings its own), identically for every
position of a verify block, so p at a draft slot is exactly what target-only sampling would draw from. The
processing itself is the `process_logits` op (plugins/reference/logits.py defines it exactly; no sort); the
verify ops apply the same processing inside, so this function is for callers that want p itself.
"""

from __future__ import annotations

import torch

import plugins


def sampling_probs(
    logits: torch.Tensor,  # [B, T, V] float
    temperature: torch.Tensor,  # [B] (0 = greedy: p is one-hot at the argmax)
    top_k: torch.Tensor,  # [B] int, 0 = off
    top_p: torch.Tensor,  # [B] float, 1 = off
) -> torch.Tensor:
    """Processed target distribution p: softmax(filter(logits / T)), [B, T, V] float32."""
    return plugins.process_logits(logits, temperature.to(torch.float32), top_k.to(torch.int64),
                                  top_p.to(torch.float32))
