"""DSpark: the DFlash backbone plus a sequential Markov head and a confidence head.

    logits_k = U_k + W2·W1[x_{k-1}]        U_k = head(h_k) from the parallel backbone; x_{-1} = the anchor
    c_k      = σ(w·[h_k ; W1[x_{k-1}]] + b) ≈ P(slot k accepted | slots < k accepted)

W1 is indexed over the draft vocabulary plus one shared row for tokens outside it (an anchor can be any token).
Sampling walks the block left to right — a cheap loop of rank-r products on top of one parallel forward — and
stops where the survival Π c falls below a threshold (dynamic truncation); probabilities stay exact softmaxes,
so verification is unchanged.
"""

from __future__ import annotations

import torch
from torch import nn

from deepspec.models.drafts.config import DraftConfig
from deepspec.models.drafts.dflash import DFlashDraft


class DSparkDraft(DFlashDraft):
    def __init__(self, cfg: DraftConfig):
        super().__init__(cfg)
        r = cfg.markov_rank
        self.markov_in = nn.Embedding(cfg.out_vocab_size + 1, r)  # W1; last row = "not in the draft vocabulary"
        self.markov_out = nn.Linear(r, cfg.out_vocab_size, bias=False)  # W2
        nn.init.zeros_(self.markov_out.weight)  # start as plain DFlash
        self.confidence = nn.Linear(cfg.hidden_size + r, 1)

    def markov(self, prev_tokens: torch.Tensor) -> torch.Tensor:
        """Target ids [..] of x_{k-1} → W1 rows [.., r]."""
        return self.markov_in(self.t2d[prev_tokens])

    def step_logits(self, hidden: torch.Tensor, base_logits: torch.Tensor, prev_tokens: torch.Tensor):
        """hidden [.., H] post-norm, base_logits U [.., N], prev_tokens [..] target ids →
        (logits [.., N], confidence logit [..])."""
        m = self.markov(prev_tokens)
        logits = base_logits + self.markov_out(m).float()
        conf = self.confidence(torch.cat([hidden, m.to(hidden.dtype)], dim=-1)).squeeze(-1).float()
        return logits, conf

    def calibrated(self, conf_logits: torch.Tensor, slot: int) -> torch.Tensor:
        """σ(c / T_slot): per-position temperature scaling of the confidence (T = 1 until eval fits it)."""
        temps = self.cfg.confidence_temperature
        t = temps[slot] if slot < len(temps) else 1.0
        return torch.sigmoid(conf_logits / t)
