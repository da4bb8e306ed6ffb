"""Distillation labels (`train --labels target`): the target's own next-token distribution over any text, from the
same forward that captures the draft's features.

Why: `--labels regen` trains on answers the target first wrote itself (`prepare`: one forward per generated
token). Here one batched prefill over text that already exists gives both what the draft reads (the captured
layers) and what it must predict (the target's distribution at every position), so prompts, reference answers or
any documents become training data at prefill speed. What regeneration still does better: the tokens the draft is
fed during TTT / blocks are the target's own greedy choices, as at inference; over foreign text they are not.

Labels are kept as the top k of the draft vocabulary (`SoftLabels`: probabilities + draft ids, [B, T, k]). The
probabilities come from the softmax over the *full* target vocabulary, gathered at the vocab map's d2t (as the
regen losses do), so mass outside the draft vocabulary or the top k is never renormalised into it. With k = 32 a
token costs 32 · (4 + 4) = 256 bytes in the offline cache, against 2.3 KiB for the final hidden state the regen
cache stores (H = 576) or 16 KiB for a dense distribution over N = 4096 draft tokens.

Shift: labels[:, t] = softmax(target logits[:, t]), the target's distribution of the token after x[t].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: default number of kept draft tokens per position (0 = the whole draft vocabulary)
DEFAULT_TOP_K = 32


@dataclass
class SoftLabels:
    #: [.., k] float32: target probability of each kept draft token (sums to <= 1)
    probs: torch.Tensor
    #: [.., k] int64: the kept tokens as draft-vocabulary ids (indices into d2t)
    ids: torch.Tensor

    def __getitem__(self, index) -> SoftLabels:
        return SoftLabels(self.probs[index], self.ids[index])

    def to(self, device) -> SoftLabels:
        return SoftLabels(self.probs.to(device), self.ids.to(device))

    def gather_positions(self, positions: torch.Tensor) -> SoftLabels:
        """positions [B, *P] (indices into T) → labels [B, *P, k] at those positions of each row."""
        B, k = positions.shape[0], self.probs.shape[-1]
        flat = positions.reshape(B, -1, 1).expand(-1, -1, k)
        shape = (*positions.shape, k)
        return SoftLabels(self.probs.gather(1, flat).view(shape), self.ids.gather(1, flat).view(shape))


def soft_labels(logits: torch.Tensor, d2t: torch.Tensor, top_k: int) -> SoftLabels:
    """logits [.., V] over the full target vocabulary → the top-k of softmax(logits) gathered at d2t [N]."""
    probs = torch.softmax(logits.float(), dim=-1).index_select(-1, d2t)  # [.., N]
    if top_k and top_k < probs.shape[-1]:
        values, ids = probs.topk(top_k, dim=-1)
        return SoftLabels(values, ids)
    return SoftLabels(probs, torch.arange(probs.shape[-1], device=probs.device).expand_as(probs).contiguous())


def kl_to_labels(labels: SoftLabels, log_q: torch.Tensor) -> torch.Tensor:
    """labels [n, k], draft log-probabilities log_q [n, N] → [n]: Σ_i p_i (log p̂_i − log q_i), p̂ = p / Σp.

    = Σp · KL(p̂ ‖ q) on the kept tokens: ≥ 0, zero iff the draft puts exactly p̂ on them; its gradient is the
    soft cross-entropy's, each position weighted by the target mass the draft vocabulary can match."""
    p = labels.probs
    log_p_hat = torch.log(p.clamp_min(1e-30)) - torch.log(p.sum(-1, keepdim=True).clamp_min(1e-30))
    return (p * (log_p_hat - log_q.gather(-1, labels.ids))).sum(-1)


def l1_to_labels(labels: SoftLabels, q: torch.Tensor) -> torch.Tensor:
    """‖q − p‖₁ over the full vocabulary [n] when p is known on its top k only: the target mass outside the kept
    tokens counts as disjoint from q (exact when k covers the draft vocabulary, an upper bound otherwise)."""
    kept_q = q.gather(-1, labels.ids)
    p = labels.probs
    return (kept_q - p).abs().sum(-1) + (1 - kept_q.sum(-1)).clamp(min=0) + (1 - p.sum(-1)).clamp(min=0)


class DistillFeatures:
    """tokens → (features [B, T, nH], SoftLabels [B, T, k]) from one forward of the frozen target."""

    def __init__(self, target, feature_layers: tuple[int, ...], d2t: torch.Tensor, top_k: int):
        self.target, self.feature_layers = target, tuple(feature_layers)
        self.d2t, self.top_k = d2t.to(target.device), top_k

    @torch.no_grad()
    def __call__(self, indices: list[int], tokens: torch.Tensor) -> tuple[torch.Tensor, SoftLabels]:
        tokens = tokens.to(self.target.device)
        out = self.target.forward(
            tokens,
            torch.zeros(tokens.shape[0], dtype=torch.long, device=tokens.device),
            None,
            feature_layers=self.feature_layers,
            logits="all",
        )
        return out.features, soft_labels(out.logits, self.d2t, self.top_k)
