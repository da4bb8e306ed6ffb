"""Building blocks shared by the three drafts: norms, RoPE, attention with separable q and k/v inputs, MLP,
and the frozen target parts (embedding + head) every draft borrows instead of storing.

Everything here is plain PyTorch with trainable `nn.Linear` weights, so drafts train under DDP/FSDP as usual;
the frozen target tensors are plain attributes (not parameters, not buffers), never saved nor synchronised.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from deepspec.models.decoder import attention_dtype_for
from deepspec.models.drafts.config import DraftConfig
from deepspec.models.packed_linear import OneDNNWeight, linear, onednn_pack, onednn_pays


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate x [B, heads, T, hd] by positions [B, T] (half-split layout, as HF Llama/Qwen/Gemma)."""
    hd = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd))
    angles = positions[:, None, :, None].float() * inv_freq  # [B, 1, T, hd/2]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    """q from one input, k/v from another (the same tensor for Eagle3; context + block for DFlash)."""

    def __init__(self, cfg: DraftConfig, input_size: int, qk_norm: bool):
        super().__init__()
        self.cfg = cfg
        self.q_proj = nn.Linear(input_size, cfg.q_size, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(input_size, cfg.kv_size, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(input_size, cfg.kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if qk_norm else None

    def query(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [B, T, in], positions [B, T] → q [B, nh, T, hd]."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.cfg.num_heads, self.cfg.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q = self.q_norm(q)
        return rope(q, positions, self.cfg.rope_theta)

    def key_value(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, in], positions [B, T] → k, v [B, nkv, T, hd]."""
        B, T, _ = x.shape
        k = self.k_proj(x).view(B, T, self.cfg.num_kv_heads, self.cfg.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.cfg.num_kv_heads, self.cfg.head_dim).transpose(1, 2)
        if self.k_norm is not None:
            k = self.k_norm(k)
        return rope(k, positions, self.cfg.rope_theta), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """q [B, nh, T, hd], k/v [B, nkv, K, hd], mask [B, 1, T, K] bool (True = visible) → [B, T, H]."""
        B, _, T, _ = q.shape
        dtype = q.dtype
        if not torch.is_grad_enabled():  # inference: the target's attention dtype rule (fp32 on CPU for bf16)
            math_dtype = attention_dtype_for(dtype, q.device)
            q, k, v = q.to(math_dtype), k.to(math_dtype), v.to(math_dtype)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.cfg.head_dim**-0.5, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.cfg.q_size).to(dtype))


class MLP(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gelu = cfg.activation == "gelu_tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate_proj(x)
        act = F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)
        return self.down_proj(act * self.up_proj(x))


class DraftModel(nn.Module):
    """Base of the three drafts: frozen target embedding/head, the optional reduced vocabulary, the head."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.cfg = cfg
        # d2t[i] = target id of draft token i (identity without a reduced vocabulary); t2d is its inverse with
        # N (= "not in the draft vocabulary") for the rest. Saved in vocab_map.safetensors, not model.safetensors.
        n = cfg.out_vocab_size
        self.register_buffer("d2t", torch.arange(n), persistent=False)
        self.register_buffer("t2d", torch.arange(cfg.vocab_size).clamp(max=n), persistent=False)
        self._embed: torch.Tensor | None = None
        self._head: torch.Tensor | None = None
        self._head_packed: OneDNNWeight | None = None  # see prepack
        self._embed_scale = 1.0

    # ---- the target's frozen parts ---------------------------------------------------------------------------
    def attach(self, target) -> DraftModel:
        """Borrow the target's embedding and head (`Target.embeddings()`, on its device); call after set_vocab."""
        frozen = target.embeddings()
        self._embed = frozen.embed
        self._embed_scale = frozen.embed_scale
        self._head_full = frozen.head
        self._head = self._head_full[self.d2t.to(self._head_full.device)].contiguous()
        return self

    def set_vocab(self, d2t: torch.Tensor) -> None:
        """Install a reduced draft vocabulary: d2t [N] sorted unique target ids."""
        d2t = torch.as_tensor(d2t, dtype=torch.long)
        if d2t.numel() != self.cfg.out_vocab_size:
            raise ValueError(f"vocab map has {d2t.numel()} ids but the draft expects {self.cfg.out_vocab_size}")
        if int(d2t.min()) < 0 or int(d2t.max()) >= self.cfg.vocab_size or d2t.unique().numel() != d2t.numel():
            raise ValueError("vocab map must hold distinct target token ids in [0, vocab_size)")
        t2d = torch.full((self.cfg.vocab_size,), d2t.numel(), dtype=torch.long)
        t2d[d2t] = torch.arange(d2t.numel())
        self.d2t = d2t.to(self.d2t.device)
        self.t2d = t2d.to(self.t2d.device)
        if self._embed is not None:
            self._head = self._head_full[self.d2t.to(self._head_full.device)].contiguous()
            self._head_packed = None

    def init_from_target(self) -> None:
        """Seed trained tensors that start from the target's (after set_vocab and attach); most drafts have none."""

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        if self._embed is None:
            raise RuntimeError("draft is not attached to a target: call draft.attach(target) first")
        x = F.embedding(tokens, self._embed)
        return x * self._embed_scale if self._embed_scale != 1.0 else x

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Post-norm hidden [.., H] → logits over the draft vocabulary [.., N] (float32)."""
        if self._head is None:
            raise RuntimeError("draft is not attached to a target: call draft.attach(target) first")
        return linear(hidden.to(self._head.dtype), self._head, None, self._head_packed).float()

    def prepack(self) -> bool:
        """For inference on CPU in bf16: reorder every linear weight (and the borrowed head) once for oneDNN, the
        way the target's Decoder.prepack does — F.linear would reorder them on every call. Returns whether it did."""
        if self._head is None or not onednn_pays(self._head):
            return False
        self._head_packed = onednn_pack(self._head)
        for child in self.modules():
            if type(child) is nn.Linear:
                PackedLinear.adopt(child, onednn_pack(child.weight.data))
        return self._head_packed is not None

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return self.d2t[draft_ids]

    def scatter_probs(self, probs: torch.Tensor) -> torch.Tensor:
        """[.., N] draft-vocab probabilities → [.., V] over the target vocabulary (zeros elsewhere)."""
        if self.cfg.draft_vocab_size == 0:
            return probs
        out = probs.new_zeros(*probs.shape[:-1], self.cfg.vocab_size)
        return (
            out.index_copy_(-1, self.d2t, probs)
            if probs.dim() == 1
            else out.scatter_(-1, self.d2t.expand_as(probs), probs)
        )

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.state_dict().items()}


class PackedLinear(nn.Linear):
    """An nn.Linear (same parameters, same state-dict keys) that runs inference on a oneDNN-reordered weight."""

    packed: OneDNNWeight | None

    @classmethod
    def adopt(cls, linear: nn.Linear, packed: OneDNNWeight | None) -> PackedLinear:
        """Make `linear` a PackedLinear in place (its parameters and its place in the module tree unchanged)."""
        linear.__class__ = cls
        assert isinstance(linear, cls)
        linear.packed = packed
        return linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.packed)
