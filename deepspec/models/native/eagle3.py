"""`NativeEagle3`: an Eagle3 draft (deepspec/models/drafts/eagle3.py) drafted by the native decoder's library, beside
the native target, on the same kernels (decoder.c, "the Eagle3 draft").

Why: through PyTorch a draft token cost a large fraction of a ~5 ms native target step (an op launch for every norm,
RoPE, cache write and matmul), so a neural draft could not pay on a CPU. Here a draft step is one call into C: the
layer's matmuls on packed int8 weights or 4-bit blocks, its norms, RoPE and attention over a float16 draft cache on
the target's routines and thread pool, and the head over the draft vocabulary's rows only.

It stands in for the PyTorch module inside `Eagle3Drafter` (as OnnxDraftModel does for the ONNX graphs): `step` and
`cached_step` run a draft step, `logits` the head, and everything else (config, vocabulary maps, `scatter_probs`)
is the PyTorch draft's, whose weights it was built from. The target's captured features go in where the target's
forward wrote them (a pointer and two strides: no copy, no torch op).

Numbers: the weights are the PyTorch draft's: its own 4-bit blocks where it was shipped in them (weights=auto), else
re-quantized as the target's are (int8 per output channel on 7 bits, or 4-bit blocks); activations per row (int8) or
per block (q4); the cache float16; the rest float32.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch

from deepspec.models.native.build import Config, load_library
from deepspec.models.native.target import ModelHandle, set_linear, set_norm
from deepspec.models.q4_weights import exact_q4

#: the draft's matrix formats: int8 per output channel (finer), 4-bit blocks (fewer bytes a step), or auto: the
#: draft's own 4-bit blocks where every matrix is on them (a draft shipped in q4), else int8 (draft_matrices)
DRAFT_WEIGHTS = ("auto", "int8", "q4")
#: ds_draft_step's statuses
_ERRORS = {
    -1: "the native draft could not allocate scratch memory",
    -2: "a draft position, cache entry or key count is outside the draft's RoPE tables or cache",
    -3: "the native draft is missing a weight it needs (fc, a layer matrix or norm, the head, or the tables)",
}
#: the layer's matrices in decoder.c's order (LIN_QKV, LIN_O, LIN_GATE_UP, LIN_DOWN)
_QKV, _O, _GATE_UP, _DOWN = range(4)
#: decoder.c's norms the draft fills (NORM_ATTN: the embedding's, NORM_MLP: post-attention, NORM_Q / NORM_K)
_EMBED_NORM, _MLP_NORM, _Q_NORM, _K_NORM = 0, 1, 4, 5


class NativeEagle3:
    """An Eagle3 draft on the native library. Build with `native_eagle3(draft, ...)`."""

    def __init__(self, draft, handle: ModelHandle, tables: dict[str, torch.Tensor], weights: str):
        self._draft = draft
        self._handle = handle
        self._tables = tables  # float32 tensors the library reads in place: kept alive with it
        self.cfg = draft.cfg
        self.weights = weights

    def __getattr__(self, name: str):  # config, vocabulary maps, scatter_probs, to_target_ids, parameters, ...
        draft = self.__dict__.get("_draft")
        if draft is None:
            raise AttributeError(name)
        return getattr(draft, name)

    @property
    def max_positions(self) -> int:
        """RoPE positions the draft's tables hold."""
        return self._tables["cos"].shape[0]

    def new_cache(self, num_slots: int, num_entries: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The draft's KV cache: k and v [slots, kv heads, entries, head dim] float16 (as the target's entries)."""
        shape = (num_slots, self.cfg.num_kv_heads, num_entries, self.cfg.head_dim)
        return torch.zeros(shape, dtype=torch.float16), torch.zeros(shape, dtype=torch.float16)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Pre-norm hidden [.., H] → float32 logits over the draft vocabulary [.., N]."""
        H = self.cfg.hidden_size
        if h.shape[-1:] != (H,):
            raise ValueError(f"draft hidden states must be [..., {H}], got {tuple(h.shape)}")
        flat = h.detach().float().reshape(-1, H).contiguous()
        out = torch.empty(*h.shape[:-1], self.cfg.out_vocab_size)
        self._status(
            self._handle.lib.ds_draft_logits(self._handle.handle, flat.shape[0], flat.data_ptr(), out.data_ptr())
        )
        return out

    def chain(
        self,
        h: torch.Tensor,
        positions: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        rows,
        k: int,
        temperature: torch.Tensor | None = None,
        uniform: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Eagle3Drafter's chain in one call (decoder.c's ds_draft_chain): from the last committed pairs' outputs h
        [B, H] at `positions` [B] (the next entry of each row), k draft tokens per row → (target ids [B, k], draft
        distributions [B, k, N] or None). Without `temperature` every row is greedy: the ids the step-by-step chain
        (`logits`, then `step` per token) picks. With temperature [B] and uniform [B, k] (a row's draws in [0, 1),
        from its own generator), a row above 0 draws each token from softmax(logits / t) by inverse CDF at its
        uniform, and the distributions come back (a greedy row's at t = 1, as pick_tokens gives)."""
        B, H = h.shape[0], self.cfg.hidden_size
        if h.shape != (B, H) or k < 1:
            raise ValueError(f"h must be [B, {H}] and k >= 1, got {tuple(h.shape)} and k={k}")
        if (temperature is None) != (uniform is None):
            raise ValueError("a sampled chain needs both temperature [B] and uniform [B, k]")
        temps = draws = probs = None
        if temperature is not None and uniform is not None:
            temps = temperature.detach().float().cpu().contiguous()
            draws = uniform.detach().float().cpu().contiguous()
            if temps.shape != (B,) or draws.shape != (B, k):
                raise ValueError(f"temperature must be [{B}] and uniform [{B}, {k}]")
            probs = torch.empty(B, k, self.cfg.out_vocab_size)
        state = h.detach().float().contiguous()
        pos = self._ints(positions, (B,), "positions", min(self.max_positions, cache_k.shape[2]) - k + 2)
        self._check_cache(cache_k, cache_v)
        slot_ids = self._ints(rows, (B,), "rows", cache_k.shape[0])
        out = np.empty((B, k), dtype=np.int64)
        status = self._handle.lib.ds_draft_chain(
            self._handle.handle,
            B,
            k,
            state.data_ptr(),
            pos.ctypes.data,
            slot_ids.ctypes.data,
            self._tables["d2t"].data_ptr(),
            cache_k.data_ptr(),
            cache_v.data_ptr(),
            cache_k.stride(0),
            cache_k.shape[2],
            temps.data_ptr() if temps is not None else None,
            draws.data_ptr() if draws is not None else None,
            probs.data_ptr() if probs is not None else None,
            out.ctypes.data,
        )
        self._status(status)
        return torch.from_numpy(out), probs

    def cached_step(self, h, tokens, positions, cache_k, cache_v, rows, cache_index=None, visible=None):
        """Eagle3Draft.cached_step's contract: write the m pairs' k/v, attend over the cache, return h' [B, m, H]."""
        return self.step(h, tokens, positions, cache_k, cache_v, rows, cache_index, visible)[0]

    def step(
        self,
        h: torch.Tensor | None,  # [B, m, H] pre-norm hidden, or None with features
        tokens: torch.Tensor,  # [B, m] target ids paired with each h
        positions: torch.Tensor,  # [B, m] RoPE positions
        cache_k: torch.Tensor,  # [S, nkv, L, hd] float16 (new_cache)
        cache_v: torch.Tensor,
        rows: torch.Tensor,  # [B] cache rows
        cache_index: torch.Tensor | None = None,  # [B, m] entry each pair writes; None = positions
        visible: torch.Tensor | None = None,  # [B, m, K] bool; None = every entry up to the pair's position
        *,
        features: torch.Tensor | None = None,  # [B, >= m, F] the target's features: h = fc(F) inside the step
        logits: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One draft step → (h' [B, m, H], logits of h' [B, m, N] when `logits`, else None). With `features`, h is
        fc(features[:, :m]) computed in C from the tensor as it lies (float32, last dimension contiguous)."""
        B, m = tokens.shape
        H = self.cfg.hidden_size
        feats = self._features(features, B, m) if features is not None else None
        if feats is None:
            if h is None or h.shape != (B, m, H):
                raise ValueError(
                    f"h must be [{B}, {m}, {H}] (or features given), got {None if h is None else tuple(h.shape)}"
                )
            h = h.detach().float().contiguous()
        ids = self._ints(tokens, (B, m), "tokens", self._tables["embed"].shape[0])
        pos = self._ints(positions, (B, m), "positions", self.max_positions)
        self._check_cache(cache_k, cache_v)
        slots, entries = cache_k.shape[0], cache_k.shape[2]
        slot_ids = self._ints(rows, (B,), "rows", slots)
        index = self._ints(cache_index, (B, m), "cache_index", entries) if cache_index is not None else None
        if index is None and int(pos.max()) >= entries:
            raise ValueError(f"positions must be below the cache's {entries} entries, got {int(pos.max())}")
        seen = self._visible(visible, B, m, entries)
        out = torch.empty(B, m, H)
        out_logits = torch.empty(B, m, self.cfg.out_vocab_size) if logits else None
        status = self._handle.lib.ds_draft_step(
            self._handle.handle,
            B,
            m,
            feats.data_ptr() if feats is not None else None,
            feats.stride(0) if feats is not None else 0,
            feats.stride(1) if feats is not None else 0,
            h.data_ptr() if feats is None and h is not None else None,
            ids.ctypes.data,
            pos.ctypes.data,
            index.ctypes.data if index is not None else None,
            slot_ids.ctypes.data,
            seen.data_ptr() if seen is not None else None,
            seen.shape[-1] if seen is not None else 0,
            cache_k.data_ptr(),
            cache_v.data_ptr(),
            cache_k.stride(0),
            entries,
            out.data_ptr(),
            out_logits.data_ptr() if out_logits is not None else None,
        )
        self._status(status)
        return out, out_logits

    # ---- input checks: bad input is a ValueError here, never a read past a buffer in C ----------------------------
    def _features(self, features: torch.Tensor, B: int, m: int) -> torch.Tensor:
        F = self.cfg.feature_size
        if features.dim() != 3 or features.shape[0] != B or features.shape[1] < m or features.shape[2] != F:
            raise ValueError(f"features must be [{B}, >= {m}, {F}] (the captured layers), got {tuple(features.shape)}")
        if features.dtype != torch.float32 or features.device.type != "cpu" or features.stride(2) != 1:
            features = features.float().cpu().contiguous()  # the native target's features need none of this
        return features

    @staticmethod
    def _ints(values: torch.Tensor, shape: tuple[int, ...], what: str, bound: int) -> np.ndarray:
        array = np.ascontiguousarray(torch.as_tensor(values).cpu().numpy(), dtype=np.int64)
        if array.shape != shape:
            raise ValueError(f"{what} must have shape {shape}, got {array.shape}")
        if array.size and (int(array.min()) < 0 or int(array.max()) >= bound):
            raise ValueError(f"{what} must be in [0, {bound}), got [{int(array.min())}, {int(array.max())}]")
        return array

    def _check_cache(self, cache_k: torch.Tensor, cache_v: torch.Tensor) -> None:
        cfg = self.cfg
        for cache in (cache_k, cache_v):
            if (
                cache.dtype != torch.float16
                or cache.device.type != "cpu"
                or cache.dim() != 4
                or cache.shape[1] != cfg.num_kv_heads
                or cache.shape[3] != cfg.head_dim
                or not cache.is_contiguous()
                or cache.shape != cache_k.shape
            ):
                raise ValueError(
                    f"the native draft needs its own float16 KV cache [slots, {cfg.num_kv_heads}, entries, "
                    f"{cfg.head_dim}] (new_cache), got {cache.dtype} {tuple(cache.shape)}"
                )

    @staticmethod
    def _visible(visible: torch.Tensor | None, B: int, m: int, entries: int) -> torch.Tensor | None:
        if visible is None:
            return None
        if visible.dim() != 3 or visible.shape[:2] != (B, m) or not 1 <= visible.shape[2] <= entries:
            raise ValueError(f"visible must be [{B}, {m}, K] with 1 <= K <= {entries}, got {tuple(visible.shape)}")
        return visible.to(torch.bool).cpu().contiguous()

    @staticmethod
    def _status(status: int) -> None:
        if status:
            raise (MemoryError if status == -1 else ValueError)(_ERRORS.get(status, f"native draft status {status}"))


def native_eagle3(
    draft, *, weights: str = "auto", num_threads: int | None = None, max_positions: int = 4096, library=None
) -> NativeEagle3:
    """The attached PyTorch Eagle3 draft `draft` on the native library: its matrices packed in `weights` (auto, int8
    or q4: draft_matrices), the head the draft vocabulary's rows (its own lm_head, or the target's rows it borrows),
    RoPE tables for
    `max_positions` positions, `num_threads` threads (the target's). `library`: another build (build.library_for)."""
    if weights not in DRAFT_WEIGHTS:
        raise ValueError(f"native draft weights must be one of {', '.join(DRAFT_WEIGHTS)}, got {weights!r}")
    if draft.cfg.algo != "eagle3":
        raise ValueError(f"the native draft runs Eagle3 drafts, got a {draft.cfg.algo} draft")
    if draft._embed is None:
        raise RuntimeError("draft is not attached to a target: call draft.attach(target) first")
    lib = library or load_library()
    cfg = draft.cfg
    threads = int(num_threads or torch.get_num_threads())
    config = Config(
        hidden=cfg.hidden_size,
        layers=1,
        heads=cfg.num_heads,
        kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        inter=cfg.intermediate_size,
        vocab=cfg.out_vocab_size,
        max_positions=max_positions,
        threads=threads,
        qk_norm=int(cfg.qk_norm),
        gelu=int(cfg.activation == "gelu_tanh"),
        sandwich=0,
        eps=cfg.rms_norm_eps,
        attn_scale=cfg.head_dim**-0.5,
        embed_scale=float(draft._embed_scale),
    )
    raw = lib.ds_model_new(ctypes.byref(config))
    if not raw:
        raise MemoryError("the native decoder could not allocate the draft's model")
    handle = ModelHandle(lib, raw)
    with torch.no_grad():
        matrices = draft_matrices(draft)
        form, blocks = _matrix_format(matrices, weights)
        _load_draft(lib, raw, draft, matrices, form, blocks)
    tables = _draft_tables(draft, max_positions)
    lib.ds_set_tables(raw, tables["embed"].data_ptr(), tables["cos"].data_ptr(), tables["sin"].data_ptr(), None, None)
    return NativeEagle3(draft, handle, tables, form)


def draft_matrices(draft) -> dict[tuple[int, int], torch.Tensor]:
    """{(layer, which): float32 matrix} as the library holds them: q|k|v and gate|up fused, o, down, fc (layer -2)
    and the head (layer -1: its own lm_head, or the target's rows of the draft vocabulary it borrows)."""
    _, _, attn, _, mlp = draft._parts
    head = draft.lm_head.weight if draft.cfg.layout == "canonical" else draft._head
    return {
        (0, _QKV): torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]),
        (0, _O): attn.o_proj.weight,
        (0, _GATE_UP): torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
        (0, _DOWN): mlp.down_proj.weight,
        (-2, 0): draft.fc.weight,
        (-1, 0): head,
    }


def _matrix_format(matrices: dict, weights: str) -> tuple[str, dict | None]:
    """(format, blocks): `weights` as asked; auto = q4 with the draft's own blocks where every matrix round-trips
    through them bit for bit (a draft shipped in q4: the native draft then computes with the weights as shipped,
    head included, where int8 would round them a second time), int8 otherwise. Asked for q4, a draft off the blocks
    is quantized onto them, its head kept int8 (as the target's)."""
    if weights != "auto":
        return weights, None
    blocks = {}
    for key, matrix in matrices.items():
        exact = exact_q4(matrix.detach().float().cpu().numpy())
        if exact is None:  # the first matrix off the blocks decides: a float draft is checked no further
            return "int8", None
        blocks[key] = exact
    return "q4", blocks


def _load_draft(lib, raw, draft, matrices: dict, form: str, blocks: dict | None) -> None:
    """The matrices in `form` (the head int8 unless its own blocks are given), the norms, the residual's rule."""
    embed_norm, hidden_norm, attn, mlp_norm, _ = draft._parts
    bias = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]) if attn.q_proj.bias is not None else None
    for (layer, which), matrix in matrices.items():
        own = blocks.get((layer, which)) if blocks is not None else None
        matrix_form = "int8" if layer == -1 and own is None else form
        set_linear(lib, raw, layer, which, matrix, bias if (layer, which) == (0, _QKV) else None, matrix_form, own)
    canonical = draft.cfg.layout == "canonical"
    set_norm(lib, raw, 0, _EMBED_NORM, embed_norm.weight)
    set_norm(lib, raw, 0, _MLP_NORM, mlp_norm.weight)
    if attn.q_norm is not None and attn.k_norm is not None:
        set_norm(lib, raw, 0, _Q_NORM, attn.q_norm.weight)
        set_norm(lib, raw, 0, _K_NORM, attn.k_norm.weight)
    set_norm(lib, raw, -2, 0, hidden_norm.weight)
    set_norm(lib, raw, -1, 0, (draft.norm if canonical else draft.final_norm).weight)
    lib.ds_set_draft(raw, int(draft.cfg.norm_before_residual))


def _draft_tables(draft, max_positions: int) -> dict[str, torch.Tensor]:
    """The tables the library reads in place: the target's embedding (the draft borrows it), the draft's RoPE halves,
    computed as layers.rope computes them (float32 angles) so a position rotates by the same numbers, and the
    vocabulary map."""
    hd = draft.cfg.head_dim
    inv_freq = 1.0 / (draft.cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    angles = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq
    return {
        "embed": draft._embed.detach().float().cpu().contiguous(),
        "d2t": draft.d2t.detach().cpu().long().contiguous(),  # draft id -> target id, for ds_draft_chain's picks
        "cos": angles.cos().contiguous(),
        "sin": angles.sin().contiguous(),
    }
