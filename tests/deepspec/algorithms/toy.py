"""A toy draft algorithm that lives in the tests folder only: the proof that one `DraftAlgorithm` registration is
all DeepSpec needs to train, evaluate, serve and export an algorithm (test_toy_algorithm.py).

Toy drafting is Eagle3's first step without attention: the pair (F[t], x[t+1]) of a target feature and the token it
predicted gives h = fc(F[t]) + embedding_weight · embed(x[t+1]), and the target's frozen head over norm(h) predicts
x[t+2]. It drafts one token per round, deterministically (argmax).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from deepspec.algorithms import DraftAlgorithm
from deepspec.decoding.drafter import DraftSampling, KVDrafter, Proposal
from deepspec.models.drafts.config import DraftConfig
from deepspec.models.drafts.layers import DraftModel, RMSNorm


@dataclass
class ToyConfig(DraftConfig):
    #: weight of the token embedding in h (a key only toy config.json files have: read back through the registry)
    embedding_weight: float = 1.0


class ToyDraft(DraftModel):
    cfg: ToyConfig

    def __init__(self, cfg: ToyConfig):
        super().__init__(cfg)
        self.fc = nn.Linear(cfg.feature_size, cfg.hidden_size, bias=False)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """features [B, T, F] (F[t]), tokens [B, T] (x[t+1]) → logits [B, T, N] over the draft vocabulary for x[t+2]."""
        h = self.fc(features.to(self.fc.weight.dtype)) + self.cfg.embedding_weight * self.embed(tokens)
        return self.head(self.norm(h))


def toy_loss(model, target, features, labels, tokens, loss_mask, generator, num_anchors):
    """training/losses.py's `Objective`: cross-entropy of x[t+2] from (F[t], x[t+1]) over assistant tokens (the
    regen labels and the anchors are not needed)."""
    logits = model(features[:, :-2], tokens[:, 1:-1])  # [B, T-2, N]
    draft_ids = model.t2d[tokens[:, 2:]]
    valid = loss_mask[:, 2:].bool() & (draft_ids < model.cfg.out_vocab_size)
    if not bool(valid.any()):
        return logits.sum() * 0.0, {}
    loss = F.cross_entropy(logits[valid], draft_ids[valid])
    return loss, {"acc0": float((logits[valid].argmax(-1) == draft_ids[valid]).float().mean())}


class ToyDrafter(KVDrafter):
    """One argmax token per round from the last committed pair of each slot."""

    name = "toy"

    def __init__(self, model: ToyDraft):
        self.model = model
        self.feature_layers = tuple(model.cfg.feature_layers)

    def bind(self, target, max_batch_size: int, max_seq_len: int) -> None:
        p = next(self.model.parameters())
        self.feature = torch.zeros(max_batch_size, self.model.cfg.feature_size, dtype=p.dtype, device=p.device)
        self.token = torch.zeros(max_batch_size, dtype=torch.long, device=p.device)
        self.has_pair = torch.zeros(max_batch_size, dtype=torch.bool)

    def reset(self, slot: int, first_token: int) -> None:
        self.has_pair[slot] = False

    @torch.inference_mode()
    def commit(self, slots, tokens, num_tokens, features) -> None:
        if features is None:
            raise ValueError("the toy drafter needs target features: the engine must capture feature_layers")
        last = (num_tokens - 1).clamp(min=0)
        rows = torch.arange(len(slots))
        index = torch.tensor(slots)
        self.feature[index] = features[rows, last].to(self.feature)
        self.token[index] = tokens[rows, last].to(self.token.device)
        self.has_pair[index] = True

    @torch.inference_mode()
    def propose(self, view, slots: list[int], k: int, sampling: DraftSampling) -> Proposal:
        index = torch.tensor(slots)
        logits = self.model(self.feature[index][:, None], self.token[index][:, None])[:, 0]  # [B, N]
        ids = self.model.to_target_ids(logits.argmax(-1)).cpu()
        return Proposal.from_rows(ids[:, None].expand(-1, k).contiguous(), self.has_pair[index].long())

    def move_slot(self, src: int, dst: int) -> None:
        self.feature[dst], self.token[dst], self.has_pair[dst] = self.feature[src], self.token[src], self.has_pair[src]


TOY = DraftAlgorithm(name="toy", module=ToyDraft, drafter=ToyDrafter, loss=toy_loss, config=ToyConfig)
