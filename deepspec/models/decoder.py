"""A lean decoder forward for the target, built for speculative decoding on CPU and GPU.

Why not the Hugging Face forward: at SmolLM2 size its per-step Python overhead costs several times the math,
and speculative decoding needs things it does not offer cheaply — a preallocated cache shared by many
sequences where rollback is moving a length pointer, per-row positions in one batched verify pass, logits for
only the positions that are sampled, and the residual outputs of chosen layers for the draft. The weights are
the Hugging Face model's own; `tests/models/test_decoder.py` checks the logits against the HF forward.

Cache layout (see deepspec/models/kv_cache.py): k, v are [num_layers, num_slots, num_kv_heads, max_seq_len,
head_dim]; the rows of a forward are slots 0..B-1, and row b writes its T new entries at positions
start[b] .. start[b]+T-1. With `tree_parents` the T tokens are a token tree instead of a chain: same writes, but
each node attends only the committed keys and its own ancestors, at position start + depth
(deepspec/models/tree_attention.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from deepspec.models.arch import ArchSpec
from deepspec.models.gguf_int4 import Int4Blocks
from deepspec.models.packed_linear import Int4Weight, int4_supported, onednn_pack, onednn_pays
from deepspec.models.packed_linear import linear as _linear
from deepspec.models.tree_attention import ancestors, check_parents, depths, tree_visibility


@dataclass
class DecoderOutput:
    #: [B, T', V] float32 logits for the requested positions (T' = T, or 1 for "last")
    logits: torch.Tensor | None
    #: [B, T, len(feature_layers) * H] residual outputs of the requested layers, or None
    features: torch.Tensor | None
    #: [B, T, H] final post-norm hidden state (what the head reads), when asked for
    final_hidden: torch.Tensor | None = None


def logits_positions(logits, B: int, T: int) -> np.ndarray | None:
    """A forward's `logits` argument (Target.forward: "all", "last", "none" or a [B] tensor) as the positions
    [B, N] int64 whose logits to return, None for none: what the backends that take an index array read (the ONNX
    graph's logits_index, the native decoder's)."""
    if isinstance(logits, torch.Tensor):
        return np.ascontiguousarray(logits.reshape(B, 1).cpu().numpy(), dtype=np.int64)
    if logits == "all":
        return np.ascontiguousarray(np.broadcast_to(np.arange(T, dtype=np.int64), (B, T)))
    if logits == "last":
        return np.full((B, 1), T - 1, dtype=np.int64)
    if logits == "none":
        return None
    raise ValueError(f"logits must be 'all', 'last', 'none' or a [B] tensor, got {logits!r}")


class _Layer(nn.Module):
    def __init__(self, spec: ArchSpec, index: int):
        super().__init__()
        H, qkv = spec.hidden_size, spec.q_size + 2 * spec.kv_size
        self.wqkv = nn.Parameter(torch.empty(qkv, H), requires_grad=False)
        self.bqkv = nn.Parameter(torch.empty(qkv), requires_grad=False) if spec.qkv_bias else None
        self.wo = nn.Parameter(torch.empty(H, spec.q_size), requires_grad=False)
        self.w_gate_up = nn.Parameter(torch.empty(2 * spec.intermediate_size, H), requires_grad=False)
        self.w_down = nn.Parameter(torch.empty(H, spec.intermediate_size), requires_grad=False)
        self.attn_norm = nn.Parameter(torch.empty(H), requires_grad=False)
        self.mlp_norm = nn.Parameter(torch.empty(H), requires_grad=False)
        if spec.sandwich_norms:
            self.post_attn_norm = nn.Parameter(torch.empty(H), requires_grad=False)
            self.post_mlp_norm = nn.Parameter(torch.empty(H), requires_grad=False)
        if spec.qk_norm:
            self.q_norm = nn.Parameter(torch.empty(spec.head_dim), requires_grad=False)
            self.k_norm = nn.Parameter(torch.empty(spec.head_dim), requires_grad=False)
        self.window = spec.sliding_windows[index] if spec.sliding_windows else 0
        #: packed copies of the matmul weights (see Decoder.prepack, Decoder.use_int4); empty = plain F.linear
        self.packed: dict[str, object] = {}


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, with rotate_half(x) * sin = roll(x, hd/2) * [-sin1, sin2] (same bits,
    three ops fewer). x: [B, T, heads, hd]; cos, sin_signed: [B, T, 1, hd]."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin_signed)


def attention_dtype_for(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """float32 for bf16/fp16 attention on CPU, else `dtype` (see Decoder.attention_dtype)."""
    if device.type == "cpu" and dtype in (torch.bfloat16, torch.float16):
        return torch.float32
    return dtype


def _rope_tables(theta: float, head_dim: int, max_len: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)) / scale
    angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
    emb = torch.cat((angles, angles), dim=-1)
    sin = emb.sin()
    half = head_dim // 2
    return emb.cos(), torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)  # sign of rotate_half folded into sin


def _as_layer(module: nn.Module) -> _Layer:
    assert isinstance(module, _Layer)  # Decoder.layers holds nothing else
    return module


class Decoder(nn.Module):
    """Embedding → N decoder layers → norm → head, with an external KV cache."""

    #: RoPE tables [max_positions, hd] (buffers, registered in __init__); the local ones only where
    #: spec.rope_local_theta is set (Gemma3's sliding-window layers)
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor
    rope_cos_local: torch.Tensor
    rope_sin_local: torch.Tensor

    def __init__(self, spec: ArchSpec, max_positions: int):
        super().__init__()
        self.spec = spec
        self.embed = nn.Parameter(torch.empty(spec.vocab_size, spec.hidden_size), requires_grad=False)
        self.layers = nn.ModuleList(_Layer(spec, i) for i in range(spec.num_layers))
        self.final_norm = nn.Parameter(torch.empty(spec.hidden_size), requires_grad=False)
        self.head = (
            self.embed if spec.tie_word_embeddings else nn.Parameter(torch.empty_like(self.embed), requires_grad=False)
        )
        self.max_positions = max_positions
        cos, sin = _rope_tables(spec.rope_theta, spec.head_dim, max_positions, spec.rope_scaling_factor)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        if spec.rope_local_theta:
            cos_l, sin_l = _rope_tables(spec.rope_local_theta, spec.head_dim, max_positions, 1.0)
            self.register_buffer("rope_cos_local", cos_l, persistent=False)
            self.register_buffer("rope_sin_local", sin_l, persistent=False)
        self.embed_scale = math.sqrt(spec.hidden_size) if spec.gemma_norms else 1.0
        self.packed_head = None

    def decoder_layers(self) -> list[_Layer]:
        """`layers` as the _Layer modules they are (a ModuleList yields them typed as nn.Module)."""
        return [_as_layer(module) for module in self.layers]

    def prepack(self) -> bool:
        """Reorder the dense matmul weights once for oneDNN where that pays (CPU, bf16); returns whether it did."""
        if not onednn_pays(self.head):
            return False
        for layer in self.decoder_layers():
            for name in _LINEARS:
                if name not in layer.packed:
                    layer.packed[name] = onednn_pack(getattr(layer, name).data)
        self.packed_head = onednn_pack(self.head.data)
        return self.packed_head is not None

    def use_int4(self, blocks: dict[str, Int4Blocks]) -> int:
        """Run the layer matmuls whose weights `blocks` holds (Hugging Face names, as int4_weights returns them)
        on their 4-bit blocks; wide inputs keep the dense weight (see Int4Weight). Returns how many went 4-bit."""
        if not int4_supported(self.embed.device):
            raise RuntimeError(
                f"4-bit GGUF weights run on CPU only (this model is on {self.embed.device}); "
                "load it without quantization on a GPU"
            )
        blocks = {_strip_prefix(k): v for k, v in blocks.items()}
        count = 0
        for i, layer in enumerate(self.decoder_layers()):
            for name, parts in _hf_linear_names(i).items():
                if all(p in blocks for p in parts):
                    try:
                        weight = Int4Weight(Int4Blocks.cat([blocks[p] for p in parts]), self.dtype)
                    except RuntimeError:  # a shape the int4 kernel cannot take (it wants N % 16 == 0): stays dense
                        continue
                    weight.dense = onednn_pack(getattr(layer, name).data)
                    layer.packed[name] = weight
                    count += 1
        return count

    # ---- weights ---------------------------------------------------------------------------------------------
    def load_hf_state_dict(self, state: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
        """Copy a Hugging Face causal-LM state dict in, fusing q/k/v and gate/up into single matmuls."""
        state = {_strip_prefix(k): v for k, v in state.items()}
        spec = self.spec

        def norm(name: str) -> torch.Tensor:
            w = state[name].float()
            # Gemma stores (w - 1) and multiplies by (1 + w) in float32; keep the norm weights in fp32 there
            return (w + 1.0) if spec.gemma_norms else w.to(dtype)

        def mat(name: str) -> torch.Tensor:
            return state[name].to(dtype)

        with torch.no_grad():
            self.embed.data = mat("embed_tokens.weight").contiguous()
            for i, layer in enumerate(self.layers):
                p = f"layers.{i}."
                a = p + "self_attn."
                for name, parts in _hf_linear_names(i).items():
                    getattr(layer, name).data = torch.cat([mat(part) for part in parts])
                if layer.bqkv is not None:
                    layer.bqkv.data = torch.cat(
                        [mat(a + "q_proj.bias"), mat(a + "k_proj.bias"), mat(a + "v_proj.bias")]
                    )
                layer.attn_norm.data = norm(p + "input_layernorm.weight")
                if spec.sandwich_norms:
                    layer.post_attn_norm.data = norm(p + "post_attention_layernorm.weight")
                    layer.mlp_norm.data = norm(p + "pre_feedforward_layernorm.weight")
                    layer.post_mlp_norm.data = norm(p + "post_feedforward_layernorm.weight")
                else:
                    layer.mlp_norm.data = norm(p + "post_attention_layernorm.weight")
                if spec.qk_norm:
                    layer.q_norm.data = norm(a + "q_norm.weight")
                    layer.k_norm.data = norm(a + "k_norm.weight")
            self.final_norm.data = norm("norm.weight")
            if spec.tie_word_embeddings or "lm_head.weight" not in state:
                self.head = self.embed
            else:
                self.head.data = mat("lm_head.weight").contiguous()

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def attention_dtype(self) -> torch.dtype:
        """The dtype of the KV cache and the attention math: float32 on CPU even for a bf16/fp16 model.

        Most CPUs have no native bf16 dot product, so the small batched matmuls of decode attention run 3-4x
        slower in bf16 than in fp32 (~3 ms of a 35 ms SmolLM2 step at 300 tokens of context), while the cache
        they read is a few MB — twice the bytes costs nothing there. On GPU the cache stays in the model dtype.
        """
        return attention_dtype_for(self.dtype, self.embed.device)

    # ---- forward ---------------------------------------------------------------------------------------------
    def _rope_at(self, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        return cos[positions].unsqueeze(2).to(self.dtype), sin[positions].unsqueeze(2).to(self.dtype)

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if self.spec.gemma_norms:
            return F.rms_norm(x.float(), (x.shape[-1],), w, self.spec.rms_norm_eps).to(x.dtype)
        return F.rms_norm(x, (x.shape[-1],), w, self.spec.rms_norm_eps)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        x = F.embedding(tokens, self.embed)
        if self.embed_scale != 1.0:
            x = x * torch.tensor(self.embed_scale, dtype=x.dtype)
        return x

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Post-norm hidden [.., H] → float32 logits [.., V]."""
        return _linear(hidden, self.head, None, self.packed_head).float()

    def forward(
        self,
        tokens: torch.Tensor,  # [B, T] int64
        start: torch.Tensor,  # [B] int64: position of tokens[:, 0] (= the row's cache length)
        cache=None,  # KVCache or None (then the T tokens are the whole context)
        *,
        feature_layers: tuple[int, ...] = (),
        logits: str | torch.Tensor = "all",  # "all" | "last" | "none" | [B] one position per row
        return_final_hidden: bool = False,
        max_start: int | None = None,  # max(start), when the caller knows it (saves a device sync)
        tree_parents: torch.Tensor | None = None,  # [B, T] int64 token tree (deepspec/models/tree_attention.py)
    ) -> DecoderOutput:
        B, T = tokens.shape
        device = tokens.device
        offsets = torch.arange(T, device=device)
        positions = start[:, None] + offsets[None, :]  # [B, T]: where the new entries are written
        if max_start is None:
            max_start = int(start.max()) if cache is not None else 0
        num_keys = max_start + T if cache is not None else T
        if num_keys > self.max_positions:
            raise ValueError(f"sequence of {num_keys} tokens exceeds the context window of {self.max_positions}")

        ancestry = depth = None
        rope_positions = positions
        if tree_parents is not None:  # a node sits at its root's position + its depth, whatever its index
            check_parents(tree_parents)  # parents given on the host are checked there, with no device read
            tree_parents = tree_parents.to(tokens.device)
            ancestry = ancestors(tree_parents)
            depth = depths(ancestry)
            rope_positions = start[:, None] + depth
        rope = self._rope_at(rope_positions, self.rope_cos, self.rope_sin)  # ([B, T, 1, hd], [B, T, 1, hd])
        rope_local = (
            self._rope_at(rope_positions, self.rope_cos_local, self.rope_sin_local)
            if self.spec.rope_local_theta
            else rope
        )
        masks = self._attention_masks(start, positions, num_keys, cache is not None, ancestry, depth)
        kv = (
            _CacheAccess(cache, B, positions, num_keys, max_start, self.spec.num_kv_heads)
            if cache is not None
            else None
        )
        attn_dtype = cache.k.dtype if cache is not None else self.attention_dtype

        x = self.embed_tokens(tokens)
        captured = []
        for i, layer in enumerate(self.layers):
            x = x + self._attention(
                i, layer, x, rope_local if layer.window else rope, masks[layer.window], kv, attn_dtype
            )
            x = x + self._mlp(layer, x)
            if i in feature_layers:
                captured.append(x)

        features = None
        if feature_layers:
            order = sorted(feature_layers)
            features = torch.cat([captured[order.index(i)] for i in feature_layers], dim=-1)
        return self._head(x, logits, features, return_final_hidden)

    def _attention_masks(
        self,
        start: torch.Tensor,
        positions: torch.Tensor,
        num_keys: int,
        cached: bool,
        ancestry: torch.Tensor | None,
        depth: torch.Tensor | None,
    ) -> dict:
        """One mask per window size, shared by all layers: key j is visible to query (b, t) iff j <= start[b] + t
        (and within the sliding window); a token tree's nodes see their ancestors. None = everything visible;
        CAUSAL = plain causal over the T tokens."""
        B, T = positions.shape
        device = positions.device
        query_pos = positions if cached else torch.arange(T, device=device)[None, :].expand(B, T)
        key_pos = torch.arange(num_keys, device=device)
        masks: dict[int, torch.Tensor | str | None] = {}
        for window in set(self.spec.sliding_windows or (0,)):
            if ancestry is not None and depth is not None:  # a token tree: both or neither
                base = start if cached else torch.zeros_like(start)
                masks[window] = tree_visibility(ancestry, depth, base, num_keys, window).unsqueeze(1)
            elif not cached and (window == 0 or window >= T):
                masks[window] = _CAUSAL
            elif T == 1 and B == 1 and (window == 0 or num_keys <= window):
                masks[window] = None
            else:
                visible = key_pos[None, None, :] <= query_pos[:, :, None]
                if window:
                    visible = visible & (key_pos[None, None, :] > query_pos[:, :, None] - window)
                masks[window] = visible.unsqueeze(1)  # [B, 1, T, K]
        return masks

    def _attention(
        self,
        i: int,
        layer,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        mask,
        kv: _CacheAccess | None,
        attn_dtype: torch.dtype,
    ) -> torch.Tensor:
        """Layer i's attention block on x [B, T, D] (its residual branch): new K/V written to the cache, then read
        back with the prefix."""
        spec = self.spec
        B, T = x.shape[:2]
        nh, nkv, hd, q_size, kv_size = spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.q_size, spec.kv_size
        h = self._norm(x, layer.attn_norm)
        packed = layer.packed
        qkv = _linear(h, layer.wqkv, layer.bqkv, packed.get("wqkv"))
        cos, sin = rope
        v = qkv[..., q_size + kv_size :].view(B, T, nkv, hd).transpose(1, 2)  # [B, nkv, T, hd]
        if spec.qk_norm:
            q = self._norm(qkv[..., :q_size].view(B, T, nh, hd), layer.q_norm)
            k = self._norm(qkv[..., q_size : q_size + kv_size].view(B, T, nkv, hd), layer.k_norm)
            q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        else:  # q and k heads side by side: one RoPE pass for both
            qk = _apply_rope(qkv[..., : q_size + kv_size].view(B, T, nh + nkv, hd), cos, sin)
            q, k = qk[:, :, :nh], qk[:, :, nh:]
        q, k = q.transpose(1, 2).to(attn_dtype), k.transpose(1, 2)  # [B, nh, T, hd], [B, nkv, T, hd]
        if kv is not None:
            k, v = kv.write_and_read(i, k, v, attn_dtype)  # [B, nkv, K, hd] views, no copy
        else:
            k, v = k.to(attn_dtype), v.to(attn_dtype)
        if mask is _CAUSAL:
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=spec.attn_scale, enable_gqa=True)
        elif T <= _SMALL_QUERY:
            attn = _grouped_attention(q, k, v, mask, spec.attn_scale)
        else:
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=spec.attn_scale, enable_gqa=True)
        attn = attn.transpose(1, 2).reshape(B, T, q_size).to(self.dtype)
        attn = _linear(attn, layer.wo, None, packed.get("wo"))
        return self._norm(attn, layer.post_attn_norm) if spec.sandwich_norms else attn

    def _mlp(self, layer, x: torch.Tensor) -> torch.Tensor:
        """The layer's gated MLP on x (its residual branch)."""
        h = self._norm(x, layer.mlp_norm)
        packed = layer.packed
        gate, up = _linear(h, layer.w_gate_up, None, packed.get("w_gate_up")).chunk(2, dim=-1)
        act = F.gelu(gate, approximate="tanh") if self.spec.activation == "gelu_tanh" else F.silu(gate)
        mlp = _linear(act * up, layer.w_down, None, packed.get("w_down"))
        return self._norm(mlp, layer.post_mlp_norm) if self.spec.sandwich_norms else mlp

    def _head(
        self, x: torch.Tensor, logits: str | torch.Tensor, features: torch.Tensor | None, return_final_hidden: bool
    ) -> DecoderOutput:
        """The final norm and the LM head at the positions asked for."""
        B = x.shape[0]
        if isinstance(logits, torch.Tensor):  # one chosen position per row (batched prefill of uneven prompts)
            x = x[torch.arange(B, device=x.device), logits].unsqueeze(1)
            logits = "all"
        elif logits == "none" and not return_final_hidden:
            return DecoderOutput(None, features)
        elif logits == "last" and not return_final_hidden:
            x = x[:, -1:]
        hidden = self._norm(x, self.final_norm)
        out_logits = None
        if logits != "none":
            out_logits = self.lm_head(hidden[:, -1:] if logits == "last" else hidden)
        return DecoderOutput(out_logits, features, hidden if return_final_hidden else None)


_CAUSAL = "causal"
#: decode and verify blocks up to this many queries use the two-matmul attention below
_SMALL_QUERY = 32


def _grouped_attention(q, k, v, mask, scale: float) -> torch.Tensor:
    """Attention for a few queries against a cache view, as two batched matmuls.

    PyTorch's CPU flash kernel spends milliseconds per call on 1-8 queries against a strided cache view; here
    the query heads that share a KV head are stacked into one matrix instead (no repeat of k/v).
    q: [B, nh, T, hd]; k, v: [B, nkv, K, hd]; mask: [B, 1, T, K] bool or None → [B, nh, T, hd].
    """
    B, nh, T, hd = q.shape
    nkv, K = k.shape[1], k.shape[2]
    g = nh // nkv
    scores = torch.matmul(q.reshape(B, nkv, g * T, hd), k.transpose(-1, -2)).float().mul_(scale)  # [B, nkv, g*T, K]
    if mask is not None:
        scores = scores.view(B, nkv, g, T, K).masked_fill(~mask[:, :, None], float("-inf")).view(B, nkv, g * T, K)
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    return torch.matmul(probs, v).view(B, nh, T, hd)


_LINEARS = ("wqkv", "wo", "w_gate_up", "w_down")


def _hf_linear_names(i: int) -> dict[str, list[str]]:
    """Each fused layer matmul → the Hugging Face weights (prefix stripped) stacked along the output dim into it."""
    p, a = f"layers.{i}.", f"layers.{i}.self_attn."
    return {
        "wqkv": [a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"],
        "wo": [a + "o_proj.weight"],
        "w_gate_up": [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"],
        "w_down": [p + "mlp.down_proj.weight"],
    }


def _strip_prefix(name: str) -> str:
    for prefix in ("model.language_model.", "language_model.model.", "model."):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


class _CacheAccess:
    """How one forward writes its new K/V into the cache and reads each layer's keys back: views of all layers at
    once, so each layer indexes one dimension (per-op overhead rules batch-1 decode), and at batch 1 a slice write
    instead of index tensors."""

    def __init__(self, cache, B: int, positions: torch.Tensor, num_keys: int, max_start: int, num_kv_heads: int):
        self.cache = cache
        self.k_read, self.v_read = cache.k[:, :B, :, :num_keys], cache.v[:, :B, :, :num_keys]  # [L, B, nkv, K, hd]
        self.single_row = B == 1
        if self.single_row:
            self.k_write, self.v_write = self.k_read[:, 0, :, max_start:], self.v_read[:, 0, :, max_start:]
        else:
            device = positions.device
            rows = torch.arange(B, device=device)[:, None, None]
            heads = torch.arange(num_kv_heads, device=device)[None, :, None]
            self.write_index = (rows, heads, positions[:, None, :])  # broadcast to [B, nkv, T]

    def write_and_read(
        self, i: int, k: torch.Tensor, v: torch.Tensor, attn_dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write layer i's new k, v [B, nkv, T, hd]; → its keys and values over the whole prefix (views)."""
        if self.single_row:  # copy_ converts to the cache dtype on the way
            self.k_write[i].copy_(k[0])
            self.v_write[i].copy_(v[0])
        else:
            self.cache.k[i].index_put_(self.write_index, k.to(attn_dtype))
            self.cache.v[i].index_put_(self.write_index, v.to(attn_dtype))
        return self.k_read[i], self.v_read[i]
