"""Eagle3: an autoregressive chain drafter fed by fused target features, trained with training-time test (TTT).

    h⁰ = fc(F)                                      F = concat of 5 target layers' residual outputs  [.., 5H]
    a  = Attention(concat(norm(emb(token)), norm(h)))  q/k/v read 2H
    h' = h + a;  h' = h' + MLP(norm(h'))               one decoder layer of the target's family
    logits = head(final_norm(h'))                      frozen target head (over the draft vocabulary)

h' (pre-norm) is the next step's h. Training unrolls γ steps in one pass (`ttt_forward`); drafting runs the same
layer against a per-slot KV cache (`cached_step`), see deepspec/decoding/drafters/eagle3.py.
"""

from __future__ import annotations

import torch
from torch import nn

from deepspec.models.drafts.config import DraftConfig
from deepspec.models.drafts.layers import MLP, Attention, DraftModel, RMSNorm


class Eagle3Draft(DraftModel):
    def __init__(self, cfg: DraftConfig):
        super().__init__(cfg)
        H = cfg.hidden_size
        self.fc = nn.Linear(cfg.feature_size, H, bias=False)
        self.embed_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.attn = Attention(cfg, 2 * H, qk_norm=cfg.qk_norm)
        self.mlp_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)
        self.final_norm = RMSNorm(H, cfg.rms_norm_eps)

    def _layer_input(self, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.embed_norm(self.embed(tokens)), self.hidden_norm(h)], dim=-1)

    def _finish(self, h: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        h = h + attn_out
        return h + self.mlp(self.mlp_norm(h))

    # ---- training: γ unrolled steps ----------------------------------------------------------------------------
    def ttt_forward(self, features: torch.Tensor, tokens: torch.Tensor, num_steps: int) -> list[torch.Tensor]:
        """features [B, T, 5H] (F[t]), tokens [B, T] → per step k: logits [B, T, N] at index t predicting the
        target distribution at position t+1+k (the token after x[t+1+k]).

        Step k feeds token x[t+1+k] (0 past the end; masked by the loss), the previous step's output as h and RoPE
        position t+k. Attention at step k: causal over step-0 keys plus the same index t of steps 1..k (the
        diagonal) — exactly what the chain sees when drafting (`ttt_mask` documents it, tests check it).
        """
        B, T, _ = features.shape
        h = self.fc(features)
        base = torch.arange(T, device=features.device)[None].expand(B, T)
        keys, values, out = [], [], []
        causal = torch.ones(T, T, dtype=torch.bool, device=features.device).tril()
        scale = self.cfg.head_dim**-0.5
        group = self.cfg.num_heads // self.cfg.num_kv_heads
        for k in range(num_steps):
            shifted = torch.zeros_like(tokens)
            if k + 1 < T:
                shifted[:, : T - 1 - k] = tokens[:, k + 1 :]
            x = self._layer_input(h, shifted)
            q = self.attn.query(x, base + k)  # [B, nh, T, hd]
            kk, vv = self.attn.key_value(x, base + k)
            keys.append(kk.repeat_interleave(group, dim=1))
            values.append(vv.repeat_interleave(group, dim=1))
            scores0 = torch.matmul(q, keys[0].transpose(-1, -2)) * scale  # [B, nh, T, T]
            scores0 = scores0.masked_fill(~causal, float("-inf"))
            diag = [(q * keys[j]).sum(-1, keepdim=True) * scale for j in range(1, k + 1)]  # [B, nh, T, 1] each
            probs = torch.softmax(torch.cat([scores0, *diag], dim=-1).float(), dim=-1).to(q.dtype)
            attn = torch.matmul(probs[..., :T], values[0])
            for j in range(1, k + 1):
                attn = attn + probs[..., T + j - 1 : T + j] * values[j]
            attn = self.attn.o_proj(attn.transpose(1, 2).reshape(B, T, self.cfg.q_size))
            h = self._finish(h, attn)
            out.append(self.head(self.final_norm(h)))
        return out

    # ---- drafting: one step against the per-slot cache -------------------------------------------------------
    def cached_step(
        self,
        h: torch.Tensor,  # [B, m, H] pre-norm hidden (fc(F) for committed pairs, the last output for drafts)
        tokens: torch.Tensor,  # [B, m] the token paired with each h
        positions: torch.Tensor,  # [B, m] position of each pair
        cache_k: torch.Tensor,  # [S, nkv, L, hd] the draft's KV cache (rows = engine slots)
        cache_v: torch.Tensor,
        rows: torch.Tensor,  # [B] cache rows (engine slots)
    ) -> torch.Tensor:
        """Write the m pairs' k/v at their positions, attend causally over the cache, return h' [B, m, H]."""
        x = self._layer_input(h, tokens)
        q = self.attn.query(x, positions)
        k, v = self.attn.key_value(x, positions)
        B, m = tokens.shape
        heads = torch.arange(self.cfg.num_kv_heads, device=h.device)[None, :, None]
        index = (rows[:, None, None], heads, positions[:, None, :])
        cache_k.index_put_(index, k)
        cache_v.index_put_(index, v)
        num_keys = int(positions.max()) + 1
        keys, vals = cache_k[rows, :, :num_keys], cache_v[rows, :, :num_keys]
        visible = torch.arange(num_keys, device=h.device)[None, None, :] <= positions[:, :, None]  # [B, m, K]
        return self._finish(h, self.attn.attend(q, keys, vals, visible[:, None]))


def ttt_mask(num_positions: int, step: int) -> torch.Tensor:
    """The attention pattern of TTT step `step` as one [T, T*(step+1)] bool matrix (True = visible), for tests and
    docs: block 0 is causal over step-0 keys, block j (1..step) is the diagonal of step j's keys."""
    T = num_positions
    blocks = [torch.ones(T, T, dtype=torch.bool).tril()] + [torch.eye(T, dtype=torch.bool)] * step
    return torch.cat(blocks, dim=1)
