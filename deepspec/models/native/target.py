"""`NativeTarget`: the `Target` (deepspec/models/target.py) whose forward is the native CPU decoder (decoder.c), and
`load_native_target`, which builds it from the same alias, GGUF or Hugging Face directory the PyTorch target loads.

The weights are those of the lean PyTorch decoder, loaded in float32, then put back on the GGUF's 4-bit blocks where
they came from them (q4_weights.py) or quantized per output channel (int8_weights.py: the ONNX int8 graph's
weights), and packed once into the library's layout (layer_weights says which); only the float32 embedding
and head stay on the Python side, for the drafts that borrow them and for `lm_head`.
The KV cache is the engine's own `KVCache`, its entries float16 (decoder.c says why; the math stays float32), so
token trees compact with the same `keep_path` op as on the PyTorch target.

What it guarantees (decoder.c's header says how): each token's logits do not depend on the other tokens of its pass
or the other rows of its batch, bit for bit. So speculative greedy output equals this target's own target-only
output at any batch size, with no batch-invariant mode to turn on; tests/deepspec/models/test_native.py checks it.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from deepspec.models.arch import ArchSpec
from deepspec.models.decoder import Decoder, DecoderOutput, logits_positions
from deepspec.models.hf_text import HFTextTarget
from deepspec.models.int8_weights import quantize_int8
from deepspec.models.kv_cache import KVCache
from deepspec.models.native.build import Config, load_library
from deepspec.models.q4_weights import exact_q4, quantize_q4
from deepspec.models.target import TargetEmbeddings
from deepspec.models.tree_attention import check_parents

#: the KV cache's entries: decoder.c stores and reads binary16 (its attention math is float32)
CACHE_DTYPE = torch.float16

#: decoder.c's enums, in its order
LINEARS = ("wqkv", "wo", "w_gate_up", "w_down")
#: the layers' weight formats: int8 per output channel (int8_weights.py), or 4-bit blocks (q4_weights.py)
WEIGHT_FORMATS = ("auto", "int8", "q4")
#: ds_forward's status for a row length outside [1, T]
BAD_ROW_LENGTH = -2
NORMS = ("attn_norm", "mlp_norm", "post_attn_norm", "post_mlp_norm", "q_norm", "k_norm")


class ModelHandle:
    """The library's model handle: freed with this object."""

    def __init__(self, lib, handle: int):
        self.lib, self.handle = lib, handle

    def __del__(self):
        if self.handle:
            self.lib.ds_model_free(self.handle)
            self.handle = None


@dataclass(eq=False, repr=False)  # compared and hashed by identity, like every target
class NativeTarget(HFTextTarget):
    name: str
    #: directory holding the tokenizer (the resolved model directory)
    path: Path
    spec: ArchSpec
    tokenizer: object
    max_seq_len: int
    eos_token_ids: tuple[int, ...]
    #: the library's threads (a recorded step curve applies at this count only)
    num_threads: int
    _model: ModelHandle = field(repr=False)
    #: float32 tensors the library reads in place (embedding, RoPE tables): kept alive with it
    _tables: dict = field(repr=False)
    _head: torch.Tensor = field(repr=False)
    embed_scale: float = 1.0
    #: the layers' weight format: int8 or q4 (layer_weights); the LM head is int8 either way
    quantization: str = "int8"

    #: forward takes tree_parents; KVCache.keep_path compacts the accepted path
    supports_tree_attention = True
    #: B rows of several tokens run as one pass (the verification budget prices them together)
    multi_token_rows_serial = False
    #: forward takes row_lengths: row b computes only its first row_lengths[b] tokens (decoder.c's pack_rows)
    ragged_rows = True
    #: torch's threads while the engine steps this target: the forward runs on the library's own threads
    host_threads = 1

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    @property
    def attention_dtype(self) -> torch.dtype:
        return CACHE_DTYPE

    @property
    def isa(self) -> str:
        """The kernel family its build runs (avx512vnni, avx512bw, avx2, portable)."""
        return self._model.lib.ds_isa().decode()

    def new_cache(self, num_slots: int, max_seq_len: int) -> KVCache:
        return KVCache(self.spec, num_slots, max_seq_len, CACHE_DTYPE)

    def forward(
        self,
        tokens: torch.Tensor,  # [B, T] long
        start: torch.Tensor,  # [B] long
        cache=None,  # KVCache.rows(first, B), or None (tokens are the whole context)
        *,
        feature_layers: tuple[int, ...] = (),
        logits: str | torch.Tensor = "all",
        return_final_hidden: bool = False,
        max_start: int | None = None,
        tree_parents: torch.Tensor | None = None,
        row_lengths: torch.Tensor | None = None,  # [B] long, each in [1, T]
    ) -> DecoderOutput:
        """The Target contract's forward; `row_lengths` (ragged rows): row b computes only its first row_lengths[b]
        tokens, each bit for bit as in a forward of those tokens alone, and the pass costs their sum. Its logits,
        features and final hidden states past them are zeros, its cache entries past them are not written."""
        B, T = tokens.shape
        ids = np.ascontiguousarray(tokens.cpu().numpy(), dtype=np.int64)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self.spec.vocab_size):
            raise ValueError(f"token ids must be in [0, {self.spec.vocab_size})")
        if cache is None:
            cache, start = self.new_cache(B, T).rows(0, B), torch.zeros(B, dtype=torch.long)
        starts = np.ascontiguousarray(start.cpu().numpy(), dtype=np.int64)
        k, v = cache.k, cache.v  # [L, B, nkv, S, hd] views of the engine's slots
        longest = int(starts.max()) + T if B else T
        if longest > min(self.max_seq_len, k.shape[3]):
            raise ValueError(
                f"sequence of {longest} tokens exceeds the context window of {min(self.max_seq_len, k.shape[3])}"
            )
        if (
            k.dtype != CACHE_DTYPE
            or k.stride() != v.stride()
            or k.stride()[2:] != (k.shape[3] * k.shape[4], k.shape[4], 1)
        ):
            raise ValueError("the native target needs its own float16 KVCache (new_cache)")
        parents = None
        if tree_parents is not None:
            check_parents(tree_parents)
            parents = np.ascontiguousarray(tree_parents.cpu().numpy(), dtype=np.int64)
        lengths = _row_lengths(row_lengths, B)
        index = logits_positions(logits, B, T)
        out_logits = torch.empty(B, index.shape[1], self.spec.vocab_size) if index is not None else None
        layers = tuple(int(i) for i in feature_layers)
        if any(not 0 <= i < self.spec.num_layers for i in layers):
            raise ValueError(f"feature layers must be in [0, {self.spec.num_layers}), got {list(layers)}")
        features = torch.empty(B, T, len(layers) * self.spec.hidden_size) if layers else None
        wanted = (ctypes.c_int * len(layers))(*layers) if layers else None
        final = torch.empty(B, T, self.spec.hidden_size) if return_final_hidden else None
        status = self._model.lib.ds_forward(
            self._model.handle,
            B,
            T,
            ids.ctypes.data,
            starts.ctypes.data,
            parents.ctypes.data if parents is not None else None,
            lengths.ctypes.data if lengths is not None else None,
            k.data_ptr(),
            v.data_ptr(),
            k.stride(0),
            k.stride(1),
            k.shape[3],
            index.ctypes.data if index is not None else None,
            index.shape[1] if index is not None else 0,
            out_logits.data_ptr() if out_logits is not None else None,
            wanted,
            len(layers),
            features.data_ptr() if features is not None else None,
            final.data_ptr() if final is not None else None,
        )
        if status == BAD_ROW_LENGTH and lengths is not None:
            raise ValueError(f"row_lengths must each be in [1, {T}] (the tokens of a row), got {lengths.tolist()}")
        if status:
            raise MemoryError(f"the native decoder could not allocate scratch memory for {B} x {T} tokens")
        return DecoderOutput(out_logits, features, final)

    def lm_head(self, final_hidden: torch.Tensor) -> torch.Tensor:
        return final_hidden.float() @ self._head.T

    def embeddings(self) -> TargetEmbeddings:
        return TargetEmbeddings(self._tables["embed"], self.embed_scale, self._head)


def _row_lengths(row_lengths: torch.Tensor | None, rows: int) -> np.ndarray | None:
    """The library's [rows] int64 lengths (None: every row full); decoder.c checks each is in [1, T]."""
    if row_lengths is None:
        return None
    lengths = np.ascontiguousarray(row_lengths.cpu().numpy(), dtype=np.int64)
    if lengths.shape != (rows,):
        raise ValueError(f"row_lengths must have one length per row, shape ({rows},), got {tuple(lengths.shape)}")
    return lengths


def load_native_target(
    spec: str,
    *,
    max_seq_len: int | None = None,
    chat_template: str | None = None,
    for_chat: bool = False,
    num_threads: int | None = None,
    weights: str = "auto",
) -> NativeTarget:
    """The target `spec` (alias, GGUF file or Hugging Face directory) on the native CPU decoder, its layers' weights
    in `weights` (native_target_from says what auto picks). The library is compiled for this machine on first use
    (build.py); NativeUnavailable when that cannot happen."""
    from deepspec.models.target_loader import load_target

    load_library()  # fail before loading weights when there is no compiler
    reference = load_target(
        spec, dtype="float32", max_seq_len=max_seq_len, chat_template=chat_template, for_chat=for_chat
    )
    return native_target_from(reference, num_threads, weights=weights)


def layer_weights(decoder, weights: str = "auto") -> tuple[str, dict | None]:
    """(format, blocks): the layers' weight format for `weights` — int8 or q4 as asked; auto = q4 where every layer
    matrix is already on 4-bit blocks (dequantized from GGUF's Q4_1, as the default target: the decoder then computes
    with the model's own weights, at 0.625 bytes a weight), int8 otherwise (a float model keeps its finer weights) —
    and, when auto chose q4, the blocks its check made ({(layer, name): (q, d, m)}), so they are not made twice."""
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"native weights must be one of {', '.join(WEIGHT_FORMATS)}, got {weights!r}")
    if weights != "auto":
        return weights, None
    blocks = {}
    for i, layer in enumerate(decoder.layers):
        for name in LINEARS:
            exact = exact_q4(getattr(layer, name).detach().float().numpy())
            if exact is None:  # the first matrix off the blocks decides: a float model is checked no further
                return "int8", None
            blocks[i, name] = exact
    return "q4", blocks


def native_target_from(
    reference, num_threads: int | None = None, library=None, *, weights: str = "auto"
) -> NativeTarget:
    """The native decoder on the weights of a loaded PyTorch target (`DecoderTarget`, float32): its text half
    (tokenizer, end ids, context) carried over, its layers' matmul weights packed in `weights`'s format
    (layer_weights), the LM head in int8. `library`: a build other than this machine's own
    (build.library_for), for tests of the other kernel families."""
    from deepspec.models.decoder_target import pytorch_decoder

    lib = library or load_library()
    decoder = pytorch_decoder(reference)
    layer_format, blocks = layer_weights(decoder, weights)
    arch = reference.spec
    threads = int(num_threads or torch.get_num_threads())
    handle = lib.ds_model_new(ctypes.byref(_native_config(arch, decoder, threads)))
    if not handle:
        raise MemoryError("the native decoder could not allocate its model")
    model = ModelHandle(lib, handle)
    _load_layers(lib, handle, decoder, arch, layer_format, blocks)
    tables = _load_tables(lib, handle, decoder, arch)
    head = tables["embed"] if decoder.head is decoder.embed else decoder.head.detach().float().contiguous()
    return NativeTarget(
        reference.name,
        reference.path,
        arch,
        reference.tokenizer,
        reference.max_seq_len,
        reference.eos_token_ids,
        threads,
        model,
        tables,
        head,
        float(decoder.embed_scale),
        quantization=layer_format,
    )


def _native_config(arch: ArchSpec, decoder: Decoder, threads: int) -> Config:
    """The library's model sizes and switches for `arch` (what ds_model_new allocates for)."""
    return Config(
        hidden=arch.hidden_size,
        layers=arch.num_layers,
        heads=arch.num_heads,
        kv_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        inter=arch.intermediate_size,
        vocab=arch.vocab_size,
        max_positions=decoder.max_positions,
        threads=threads,
        qk_norm=int(arch.qk_norm),
        gelu=int(arch.activation == "gelu_tanh"),
        sandwich=int(arch.sandwich_norms),
        eps=arch.rms_norm_eps,
        attn_scale=arch.attn_scale,
        embed_scale=float(decoder.embed_scale),
    )


def _load_layers(lib, handle, decoder: Decoder, arch: ArchSpec, layer_format: str, blocks) -> None:
    """Copy every layer's matmul weights (packed in `layer_format`: int8, or q4 from `blocks` where the GGUF had
    them) and norms into the library's model, then the int8 LM head and the final norm."""
    for i, layer in enumerate(decoder.decoder_layers()):
        for which, name in enumerate(LINEARS):
            block = blocks.pop((i, name)) if blocks is not None and layer_format == "q4" else None
            bias = layer.bqkv if name == "wqkv" else None
            set_linear(lib, handle, i, which, getattr(layer, name), bias, layer_format, block)
        for which, name in enumerate(NORMS):
            if hasattr(layer, name):
                set_norm(lib, handle, i, which, getattr(layer, name))
        lib.ds_set_window(handle, i, int(layer.window), int(bool(layer.window and arch.rope_local_theta)))
    set_linear(lib, handle, -1, 0, decoder.head, None, "int8")
    set_norm(lib, handle, -1, 0, decoder.final_norm)


def _check(status: int, what: str) -> None:
    if status:
        raise MemoryError(f"the native decoder could not allocate {what}")


def set_linear(lib, handle, layer: int, which: int, weight, bias, form: str, blocks=None) -> None:
    """Pack one matrix into the library's model (`layer` -1: the LM head, -2: a draft's fc) in `form`: int8 per
    output channel, or q4 — from `blocks` (q, d, m) where they are the model's own, else quantized here."""
    w = weight.detach().float().numpy()
    b = np.ascontiguousarray(bias.detach().float().numpy()) if bias is not None else None
    bias_ptr = b.ctypes.data if b is not None else None
    if form == "q4":
        q, d, m = blocks if blocks is not None else quantize_q4(w)
        _check(
            lib.ds_set_linear_q4(
                handle, layer, which, q.ctypes.data, d.ctypes.data, m.ctypes.data, bias_ptr, q.shape[0], q.shape[1]
            ),
            "a weight matrix",
        )
        return
    q, scale = quantize_int8(w)
    _check(
        lib.ds_set_linear(handle, layer, which, q.ctypes.data, scale.ctypes.data, bias_ptr, q.shape[0], q.shape[1]),
        "a weight matrix",
    )


def set_norm(lib, handle, layer: int, which: int, weight) -> None:
    """Copy one norm's weights into the library's model (`layer` -1: the final norm, -2: a draft's hidden norm)."""
    w = np.ascontiguousarray(weight.detach().float().numpy())
    _check(lib.ds_set_norm(handle, layer, which, w.ctypes.data, w.size), "a norm")


def _load_tables(lib, handle, decoder: Decoder, arch: ArchSpec) -> dict[str, torch.Tensor]:
    """Hand the library the float32 tables it reads in place (embedding, RoPE halves, local RoPE where Gemma3 has
    one) → those tensors, which must outlive the model."""
    half = arch.head_dim // 2
    tables = {"embed": decoder.embed.detach().float().contiguous()}

    def rope_halves(cos: torch.Tensor, sin: torch.Tensor, key: str) -> None:
        # the decoder's tables repeat cos over both halves and fold rotate_half's sign into sin: [-sin, sin]
        tables[key + "cos"] = cos[:, :half].float().contiguous()
        tables[key + "sin"] = sin[:, half:].float().contiguous()

    rope_halves(decoder.rope_cos, decoder.rope_sin, "")
    if arch.rope_local_theta:
        rope_halves(decoder.rope_cos_local, decoder.rope_sin_local, "local_")
    lib.ds_set_tables(
        handle,
        tables["embed"].data_ptr(),
        tables["cos"].data_ptr(),
        tables["sin"].data_ptr(),
        tables["local_cos"].data_ptr() if "local_cos" in tables else None,
        tables["local_sin"].data_ptr() if "local_sin" in tables else None,
    )
    return tables
