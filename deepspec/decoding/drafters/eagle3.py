"""Eagle3 drafting: a chain of γ single-token draft steps against the draft's own per-slot KV cache.

The cache holds one entry per committed pair (F[p-1], x[p]) at position p-1. `propose` drafts from the last
committed pair's output; its speculative entries are simply overwritten when `extend` re-feeds the committed
tokens with the *target's* features from the verify pass (crop to the committed length + re-extend).
"""

from __future__ import annotations

import torch

from deepspec.decoding.drafter import DraftSampling, Proposal
from deepspec.decoding.drafters.neural import NeuralDrafter, pack, pick_tokens
from deepspec.models.target import Target


class Eagle3Drafter(NeuralDrafter):
    name = "eagle3"

    def bind(self, target: Target, max_batch_size: int, max_seq_len: int) -> None:
        self._check_target(target)
        self.cache_k, self.cache_v = self._new_cache(max_batch_size, max_seq_len)
        H = self.cfg.hidden_size
        p = next(self.model.parameters())
        self.length = torch.zeros(max_batch_size, dtype=torch.long)  # committed pairs per slot
        self.last_h = torch.zeros(max_batch_size, H, dtype=p.dtype, device=p.device)
        self.has_pair = [False] * max_batch_size

    def reset(self, slot: int, first_token: int) -> None:
        self.length[slot] = 0
        self.has_pair[slot] = False

    @torch.inference_mode()
    def extend(self, slots, tokens, num_tokens, features) -> None:
        if features is None:
            raise ValueError("the eagle3 drafter needs target features: the engine must capture feature_layers")
        device = self.last_h.device
        rows = torch.tensor(slots, dtype=torch.long, device=device)
        m = tokens.shape[1]
        start = self.length[slots].to(device)
        positions = start[:, None] + torch.arange(m, device=device)
        h = self.model.cached_step(self.model.fc(features[:, :m].to(device, self.last_h.dtype)),
                                   tokens.to(device), positions, self.cache_k, self.cache_v, rows)
        last = (num_tokens.to(device) - 1).clamp(min=0)
        self.last_h[rows] = h[torch.arange(len(slots), device=device), last]
        for row, slot in enumerate(slots):
            self.length[slot] += int(num_tokens[row])
            self.has_pair[slot] = True

    @torch.inference_mode()
    def propose(self, slots: list[int], k: int, sampling: DraftSampling) -> Proposal:
        device = self.last_h.device
        rows = torch.tensor(slots, dtype=torch.long, device=device)
        want_probs = not sampling.all_greedy
        h = self.last_h[rows][:, None]  # [B, 1, H]
        position = self.length[slots].to(device)[:, None]
        tokens, probs = [], [] if want_probs else None
        for step in range(k):
            logits = self.model.logits(h[:, 0])
            ids, p = pick_tokens(logits, sampling, self.model, want_probs)
            tokens.append(ids)
            if want_probs:
                probs.append(p)
            if step + 1 < k:
                h = self.model.cached_step(h, ids[:, None], position + step, self.cache_k, self.cache_v, rows)
        num = torch.tensor([k if self.has_pair[s] else 0 for s in slots], dtype=torch.long)
        return pack(tokens, probs, k, num)

    def move_slot(self, src: int, dst: int) -> None:
        n = int(self.length[src])
        self.cache_k[dst, :, :n] = self.cache_k[src, :, :n]
        self.cache_v[dst, :, :n] = self.cache_v[src, :, :n]
        self.length[dst] = self.length[src]
        self.last_h[dst] = self.last_h[src]
        self.has_pair[dst] = self.has_pair[src]
