"""Eagle3: an autoregressive chain drafter fed by fused target features, trained with training-time test (TTT).

    h⁰ = fc(F)                                      F = concat of the captured target layers' residual outputs
    a  = Attention(concat(norm(emb(token)), norm(h)))  q/k/v read 2H
    h' = h + a;  h' = h' + MLP(norm(h'))               one decoder layer of the target's family
    logits = head(final_norm(h'))                      over the draft vocabulary

h' (pre-norm) is the next step's h. Training unrolls γ steps in one pass (`ttt_forward`); drafting runs the same
layer against a per-slot KV cache (`cached_step`), see deepspec/decoding/drafters/eagle3.py.

Two tensor layouts (`DraftConfig.layout`), the same forward:

- "deepspec" (the shipped drafts): flat names (`fc`, `embed_norm`, `hidden_norm`, `attn.*`, `mlp_norm`, `mlp.*`,
  `final_norm`), 5 captured layers, the target's frozen head gathered on the draft vocabulary (not stored).
- "canonical": the EAGLE-3 layout SGLang, vLLM and TensorRT-LLM load — a Llama-style layer, 3 captured layers,
  `norm_before_residual = false`, its own trained `lm_head` (initialised from the target's rows) and the vocabulary
  map as offsets. Its state_dict is exactly (H hidden, I intermediate, N draft vocabulary, V target vocabulary,
  nh/nkv heads of size hd):

      fc.weight                                   [H, 3H]
      midlayer.input_layernorm.weight             [H]        (applied to the token embedding)
      midlayer.hidden_norm.weight                 [H]        (applied to h)
      midlayer.self_attn.q_proj.weight            [nh*hd, 2H]
      midlayer.self_attn.k_proj.weight            [nkv*hd, 2H]
      midlayer.self_attn.v_proj.weight            [nkv*hd, 2H]
      midlayer.self_attn.o_proj.weight            [H, nh*hd]
      midlayer.post_attention_layernorm.weight    [H]
      midlayer.mlp.gate_proj.weight               [I, H]
      midlayer.mlp.up_proj.weight                 [I, H]
      midlayer.mlp.down_proj.weight               [H, I]
      norm.weight                                 [H]
      lm_head.weight                              [N, H]
      d2t                                         [N] int64 offsets: target id = i + d2t[i]
      t2d                                         [V] bool: the target token is in the draft vocabulary

  Inside the module `d2t`/`t2d` stay the absolute ids every draft uses; the offsets and the mask exist only in the
  state_dict (hooks below), so a canonical state_dict is what the engines read, tensor for tensor.
"""

from __future__ import annotations

import torch
from torch import nn

from deepspec.models.drafts.config import DraftConfig
from deepspec.models.drafts.layers import MLP, Attention, DraftModel, RMSNorm
from deepspec.models.packed_linear import linear


class Eagle3Layer(nn.Module):
    """The one decoder layer, with the canonical EAGLE-3 names (`midlayer.*` in that layout)."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        H = cfg.hidden_size
        self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, 2 * H, qk_norm=cfg.qk_norm)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)


class Eagle3Draft(DraftModel):
    def __init__(self, cfg: DraftConfig):
        super().__init__(cfg)
        H = cfg.hidden_size
        self.fc = nn.Linear(cfg.feature_size, H, bias=False)
        layer = Eagle3Layer(cfg)
        if cfg.layout == "canonical":
            self.midlayer = layer
            self.norm = RMSNorm(H, cfg.rms_norm_eps)
            self.lm_head = nn.Linear(H, cfg.out_vocab_size, bias=False)
            self._register_state_dict_hook(_vocab_map_to_state)
            self._register_load_state_dict_pre_hook(_vocab_map_from_state, with_module=True)
        else:  # the shipped drafts' names, kept so their checkpoints load unchanged
            self.embed_norm = layer.input_layernorm
            self.hidden_norm = layer.hidden_norm
            self.attn = layer.self_attn
            self.mlp_norm = layer.post_attention_layernorm
            self.mlp = layer.mlp
            self.final_norm = RMSNorm(H, cfg.rms_norm_eps)

    # ---- the layer's parts under either layout -----------------------------------------------------------------
    @property
    def _parts(self) -> tuple[RMSNorm, RMSNorm, Attention, RMSNorm, MLP]:
        """(embedding norm, hidden norm, attention, post-attention norm, MLP)."""
        if self.cfg.layout == "canonical":
            m = self.midlayer
            return m.input_layernorm, m.hidden_norm, m.self_attn, m.post_attention_layernorm, m.mlp
        return self.embed_norm, self.hidden_norm, self.attn, self.mlp_norm, self.mlp

    def output_norm(self, h: torch.Tensor) -> torch.Tensor:
        """Pre-norm hidden [.., H] → what the head reads [.., H]."""
        return (self.norm if self.cfg.layout == "canonical" else self.final_norm)(h)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Pre-norm hidden [.., H] → float32 logits over the draft vocabulary [.., N]."""
        return self.head(self.output_norm(h))

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.cfg.layout != "canonical":
            return super().head(hidden)
        w = self.lm_head.weight
        return linear(hidden.to(w.dtype), w, None, getattr(self.lm_head, "packed", None)).float()

    def init_from_target(self) -> None:
        """A fresh canonical draft's lm_head starts as the target's head rows of the draft vocabulary (what the
        deepspec layout uses frozen); call after set_vocab and attach. The deepspec layout has nothing to copy."""
        if self.cfg.layout == "canonical":
            if self._head is None:
                raise RuntimeError("draft is not attached to a target: call draft.attach(target) first")
            with torch.no_grad():
                self.lm_head.weight.copy_(self._head.to(self.lm_head.weight.dtype))

    def _layer_input(self, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        embed_norm, hidden_norm, *_ = self._parts
        return torch.cat([embed_norm(self.embed(tokens)), hidden_norm(h)], dim=-1)

    def _finish(self, h: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        _, hidden_norm, _, mlp_norm, mlp = self._parts
        h = (hidden_norm(h) if self.cfg.norm_before_residual else h) + attn_out
        return h + mlp(mlp_norm(h))

    # ---- training: γ unrolled steps ----------------------------------------------------------------------------
    def ttt_forward(
        self, features: torch.Tensor, tokens: torch.Tensor, num_steps: int, queries: torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        """features [B, T, nH] (F[t]), tokens [B, T] → per step k: logits [B, n, N] at index t predicting the
        target distribution at position t+1+k (the token after x[t+1+k]), for the n indices `queries` [B, n]
        (ascending; None = every index, n = T).

        Step k feeds token x[t+1+k] (0 past the end; masked by the loss), the previous step's output as h and RoPE
        position t+k. Attention at step k: causal over step-0 keys plus the same index t of steps 1..k (the
        diagonal) — exactly what the chain sees when drafting (`ttt_mask` documents it, tests check it). Step-0
        keys are computed at every index; everything else only at `queries`, since no other index reads it: the
        loss names the indices it trains (the assistant answers), and the rest of the sequence costs one
        projection instead of γ steps forward and backward.
        """
        B, T, _ = features.shape
        attn_mod = self._parts[2]
        scale = self.cfg.head_dim**-0.5
        group = self.cfg.num_heads // self.cfg.num_kv_heads
        h = self.fc(features)
        next_tokens = torch.cat([tokens, tokens.new_zeros(B, num_steps + 1)], dim=1)  # x[t+1+k], 0 past the end
        base = torch.arange(T, device=features.device)[None].expand(B, T)
        x = self._layer_input(h, next_tokens[:, 1 : T + 1])
        k0, v0 = attn_mod.key_value(x, base)
        keys, values = [k0.repeat_interleave(group, dim=1)], [v0.repeat_interleave(group, dim=1)]
        idx = base if queries is None else queries
        if queries is not None:
            h, x = _rows(h, idx), _rows(x, idx)
        causal = torch.arange(T, device=features.device)[None, None, :] <= idx[:, :, None]  # [B, n, T]
        out = []
        for k in range(num_steps):
            if k > 0:
                x = self._layer_input(h, next_tokens.gather(1, idx + 1 + k))
                kk, vv = attn_mod.key_value(x, idx + k)
                keys.append(kk.repeat_interleave(group, dim=1))
                values.append(vv.repeat_interleave(group, dim=1))
            q = attn_mod.query(x, idx + k)  # [B, nh, n, hd]
            scores0 = torch.matmul(q, keys[0].transpose(-1, -2)) * scale  # [B, nh, n, T]
            scores0 = scores0.masked_fill(~causal[:, None], float("-inf"))
            diag = [(q * keys[j]).sum(-1, keepdim=True) * scale for j in range(1, k + 1)]  # [B, nh, n, 1] each
            probs = torch.softmax(torch.cat([scores0, *diag], dim=-1).float(), dim=-1).to(q.dtype)
            attn = torch.matmul(probs[..., :T], values[0])
            for j in range(1, k + 1):
                attn = attn + probs[..., T + j - 1 : T + j] * values[j]
            attn = attn_mod.o_proj(attn.transpose(1, 2).reshape(B, idx.shape[1], self.cfg.q_size))
            h = self._finish(h, attn)
            out.append(self.logits(h))
        return out

    # ---- drafting: one step against the per-slot cache -------------------------------------------------------
    def cached_step(
        self,
        h: torch.Tensor,  # [B, m, H] pre-norm hidden (fc(F) for committed pairs, the last output for drafts)
        tokens: torch.Tensor,  # [B, m] the token paired with each h
        positions: torch.Tensor,  # [B, m] RoPE position of each pair
        cache_k: torch.Tensor,  # [S, nkv, L, hd] the draft's KV cache (rows = engine slots)
        cache_v: torch.Tensor,
        rows: torch.Tensor,  # [B] cache rows (engine slots)
        cache_index: torch.Tensor | None = None,  # [B, m] cache entry each pair is written to; None = positions
        visible: torch.Tensor | None = None,  # [B, m, K] bool: cache entries 0..K-1 each pair sees; None = causal
    ) -> torch.Tensor:
        """Write the m pairs' k/v, attend over the cache, return h' [B, m, H].

        A chain writes each pair at its position and attends causally. A draft tree feeds siblings that share a
        position, so it writes them to distinct entries past the committed ones (`cache_index`) and lets each
        see only the committed entries, its ancestors and itself (`visible`)."""
        x = self._layer_input(h, tokens)
        attn_mod = self._parts[2]
        q = attn_mod.query(x, positions)
        k, v = attn_mod.key_value(x, positions)
        where = positions if cache_index is None else cache_index
        heads = torch.arange(self.cfg.num_kv_heads, device=h.device)[None, :, None]
        index = (rows[:, None, None], heads, where[:, None, :])
        cache_k.index_put_(index, k)
        cache_v.index_put_(index, v)
        if visible is None:
            num_keys = int(positions.max()) + 1
            visible = torch.arange(num_keys, device=h.device)[None, None, :] <= positions[:, :, None]  # [B, m, K]
        num_keys = visible.shape[-1]
        keys, vals = cache_k[rows, :, :num_keys], cache_v[rows, :, :num_keys]
        return self._finish(h, attn_mod.attend(q, keys, vals, visible[:, None]))


def _rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x [B, T, D], index [B, n] → x at those indices of each row [B, n, D]."""
    return x.gather(1, index[..., None].expand(-1, -1, x.shape[-1]))


def ttt_mask(num_positions: int, step: int) -> torch.Tensor:
    """The attention pattern of TTT step `step` as one [T, T*(step+1)] bool matrix (True = visible), for tests and
    docs: block 0 is causal over step-0 keys, block j (1..step) is the diagonal of step j's keys."""
    T = num_positions
    blocks = [torch.ones(T, T, dtype=torch.bool).tril()] + [torch.eye(T, dtype=torch.bool)] * step
    return torch.cat(blocks, dim=1)


def _vocab_map_to_state(module: Eagle3Draft, state: dict, prefix: str, local_metadata) -> None:
    """state_dict hook of the canonical layout: add d2t as offsets and t2d as a mask, the engines' encoding."""
    n = module.d2t.numel()
    state[prefix + "d2t"] = module.d2t - torch.arange(n, device=module.d2t.device)
    state[prefix + "t2d"] = module.t2d < n


def _vocab_map_from_state(module: Eagle3Draft, state: dict, prefix: str, *args) -> None:
    """load_state_dict pre-hook: turn the offsets back into the vocabulary map (t2d follows from d2t)."""
    offsets = state.pop(prefix + "d2t", None)
    state.pop(prefix + "t2d", None)
    if offsets is not None:
        module.set_vocab(offsets.long().cpu() + torch.arange(offsets.numel()))
