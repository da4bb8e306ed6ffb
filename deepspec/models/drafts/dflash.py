"""DFlash: a one-shot parallel block drafter whose keys/values inject the target's context features.

    C = norm(fc(F))                        once per context position, shared by all draft layers
    block = embed([anchor, MASK × (γ-1)])  at positions a … a+γ-1; slot j predicts x[a+1+j] ("anchor-first")
    each layer: q from the block; k/v = [proj(C) ; proj(block)] (its own k/v projections, RoPE at true positions,
                k-norm on both); the block attends to context positions < a and to itself bidirectionally
    logits = head(final_norm(h))           frozen target head

The anchor's own feature F[a] is never visible: when drafting it does not exist yet (the verify pass that
produces it is the one the draft is preparing). MASK is a trained vector of the draft, not a target token.
"""

from __future__ import annotations

import torch
from torch import nn

from deepspec.models.drafts.config import DraftConfig
from deepspec.models.drafts.layers import MLP, Attention, DraftModel, RMSNorm


class _BlockLayer(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg, cfg.hidden_size, qk_norm=True)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, h, positions, ctx_k, ctx_v, mask):
        """h [B, Q, H] block states at positions [B, Q]; ctx_k/v [B, nkv, K, hd]; mask [B, 1, Q, K+Q]."""
        x = self.attn_norm(h)
        q = self.attn.query(x, positions)
        k, v = self.attn.key_value(x, positions)
        out = self.attn.attend(q, torch.cat([ctx_k, k], dim=2), torch.cat([ctx_v, v], dim=2), mask)
        h = h + out
        return h + self.mlp(self.mlp_norm(h))


class DFlashDraft(DraftModel):
    def __init__(self, cfg: DraftConfig):
        super().__init__(cfg)
        H = cfg.hidden_size
        self.fc = nn.Linear(cfg.feature_size, H, bias=False)
        self.context_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.mask_embedding = nn.Parameter(torch.randn(H) * 0.02)
        self.layers = nn.ModuleList(_BlockLayer(cfg) for _ in range(cfg.num_layers))
        self.final_norm = RMSNorm(H, cfg.rms_norm_eps)

    def context(self, features: torch.Tensor) -> torch.Tensor:
        """F [.., 5H] → C [.., H]."""
        return self.context_norm(self.fc(features))

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """C [B, T, H] at positions [B, T] → per layer (k, v) [B, nkv, T, hd]; what the drafter caches."""
        kv = []
        for layer in self.layers:
            assert isinstance(layer, _BlockLayer)  # all `layers` are
            kv.append(layer.attn.key_value(ctx, positions))
        return kv

    def block_input(self, anchors: torch.Tensor) -> torch.Tensor:
        """anchor tokens [B, A] → [B, A*γ, H]: embed(anchor) then MASK × (γ-1) per block."""
        B, A = anchors.shape
        γ = self.cfg.block_size
        first = self.embed(anchors)[:, :, None]  # [B, A, 1, H]
        rest = self.mask_embedding.to(first.dtype).expand(B, A, γ - 1, -1)
        return torch.cat([first, rest], dim=2).reshape(B, A * γ, -1)

    def blocks(self, block_h, block_pos, ctx_kv, mask) -> torch.Tensor:
        """Run the layers over block states; returns post-norm hidden [B, Q, H]."""
        h = block_h
        for layer, (k, v) in zip(self.layers, ctx_kv):
            h = layer(h, block_pos, k, v, mask)
        return self.final_norm(h)

    # ---- training: many anchors per sequence in one forward --------------------------------------------------
    def train_forward(self, features: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """features [B, T, 5H], tokens [B, T], anchors [B, A] positions → post-norm hidden [B, A, γ, H];
        slot j of block i predicts tokens[anchors[i] + 1 + j]."""
        B, T, _ = features.shape
        A, γ = anchors.shape[1], self.cfg.block_size
        ctx_pos = torch.arange(T, device=features.device)[None].expand(B, T)
        ctx_kv = self.context_kv(self.context(features), ctx_pos)
        anchor_tokens = tokens.gather(1, anchors)
        block_pos = (anchors[:, :, None] + torch.arange(γ, device=anchors.device)).reshape(B, A * γ)
        mask = block_mask(anchors, T, γ)[:, None]
        h = self.blocks(self.block_input(anchor_tokens), block_pos, ctx_kv, mask)
        return h.view(B, A, γ, -1)


def block_mask(anchors: torch.Tensor, num_context: int, block_size: int) -> torch.Tensor:
    """anchors [B, A] → visibility [B, A*γ, T + A*γ] (True = visible).

    Query (block i, slot j) sees context key p iff p < anchors[i] (never the anchor's own feature) and every
    slot of its own block (bidirectional); nothing of other blocks."""
    B, A = anchors.shape
    γ = block_size
    ctx = torch.arange(num_context, device=anchors.device)[None, None, :] < anchors[:, :, None]  # [B, A, T]
    ctx = ctx[:, :, None, :].expand(B, A, γ, num_context).reshape(B, A * γ, num_context)
    block_id = torch.arange(A, device=anchors.device).repeat_interleave(γ)
    own = (block_id[:, None] == block_id[None, :])[None].expand(B, A * γ, A * γ)
    return torch.cat([ctx, own], dim=-1)
