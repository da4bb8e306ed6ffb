"""What the three trained drafters (Eagle3, DFlash, DSpark) share: binding a draft model to the engine's slots,
per-row sampling of draft tokens, and packing proposals. Each drafter keeps its own KV cache rows indexed by
engine slot, so `move_slot` is one row copy.
"""

from __future__ import annotations

from pathlib import Path

import torch

from deepspec.decoding.drafter import DraftSampling, Drafter, Proposal
from deepspec.models.target import Target

#: cache positions past max_seq_len: drafts of a row near its limit still have somewhere to go
CACHE_SLACK = 64


class NeuralDrafter(Drafter):
    def __init__(self, model):
        self.model = model
        self.cfg = model.cfg
        self.feature_layers = tuple(model.cfg.feature_layers)
        self.max_batch_size = 0

    def _check_target(self, target: Target) -> None:
        from deepspec.models.drafts.checkpoint import check_target

        check_target(self.cfg, target, where=f"{self.name} draft")

    def _new_cache(self, num_slots: int, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        p = next(self.model.parameters())
        shape = (num_slots, self.cfg.num_kv_heads, max_len + CACHE_SLACK, self.cfg.head_dim)
        return torch.zeros(shape, dtype=p.dtype, device=p.device), torch.zeros(shape, dtype=p.dtype, device=p.device)


def checkpoint_loader(cls: type[NeuralDrafter]):
    """The registry's loader for draft directories of cls.name: read the weights (checked against the target's
    fingerprint, attached to its embedding and head), then wrap them in `cls`."""

    def load(path: Path, header: dict, target: Target, **options) -> NeuralDrafter:
        from deepspec.models.drafts import load_draft

        return cls(load_draft(path, target), **options)

    return load


def pick_tokens(logits: torch.Tensor, sampling: DraftSampling, model, want_probs: bool):
    """logits [B, N] over the draft vocabulary → (target ids [B], probs [B, V] | None).

    Greedy rows take the argmax; sampled rows draw from softmax(logits / T) with their own generator. The
    returned probs are that exact distribution scattered onto the target vocabulary (rejection sampling's q)."""
    B = logits.shape[0]
    temps = sampling.temperature.to(logits.device, torch.float32)
    ids = logits.argmax(dim=-1)
    probs = None
    if want_probs:
        safe = torch.where(temps > 0, temps, torch.ones_like(temps))
        draft_probs = torch.softmax(logits / safe[:, None], dim=-1)
        for row in range(B):
            if float(temps[row]) > 0:
                ids[row] = torch.multinomial(draft_probs[row].cpu(), 1, generator=sampling.generators[row])[0]
        probs = model.scatter_probs(draft_probs)
    return model.to_target_ids(ids), probs


def pack(tokens: list[torch.Tensor], probs: list[torch.Tensor] | None, k: int, num: torch.Tensor,
         survival: list[torch.Tensor] | None = None) -> Proposal:
    """Stack per-slot columns into a Proposal of width k (pad with the last column / zero probs / zero survival)."""
    cols = tokens[:k]
    while len(cols) < k:
        cols.append(cols[-1])
    out_tokens = torch.stack(cols, dim=1).cpu()
    out_probs = None
    if probs is not None:
        p = probs[:k]
        while len(p) < k:
            p.append(torch.zeros_like(p[-1]))
        out_probs = torch.stack(p, dim=1)
    out_survival = None
    if survival is not None:
        out_survival = torch.zeros(len(num), k)
        width = min(len(survival), k)
        out_survival[:, :width] = torch.stack(survival[:width], dim=1).float().cpu()
        out_survival[torch.arange(k)[None, :] >= num.clamp(max=k).cpu()[:, None]] = 0.0
    return Proposal(out_tokens, num.clamp(max=k).cpu(), out_probs, out_survival)
