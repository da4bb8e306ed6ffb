"""The target as everything above it sees it: the one contract the engine, the worker, training and tests type against.

Contract only, no behaviour. `load_target` returns one of two backends that implement it: `DecoderTarget`
(deepspec/models/decoder_target.py, the lean PyTorch decoder) for a model directory, alias or GGUF, and
`OnnxTarget` (deepspec/models/onnx_target.py, an ONNX Runtime session) for a `python -m export --format onnx`
directory; `load_native_target` returns a third, `NativeTarget` (deepspec/models/native, 4-bit blocks or int8
weights in C compiled for this CPU); the service's stub target implements the same members, and all run under the
real `SpecEngine` unchanged. Nothing above this layer reaches into a target's internals (the PyTorch decoder is
`_model`, and tests/deepspec/test_layering.py fails on a `target.model` outside deepspec/models): what it needs is a
member here, or, for an exporter that rewrites the weights, `pytorch_decoder(target)`.

Shapes use B = rows of one forward (the engine's slots 0..B-1), T = new tokens per row, V = vocab_size,
H = spec.hidden_size, L = len(feature_layers).

Members and their contracts:

Identity and limits
- `name: str` — what the worker serves it as (the OpenAI `model` field).
- `spec: ArchSpec` — the sizes a draft is built to (hidden_size, num_layers, vocab_size, ...).
- `vocab_size: int` — ids are in [0, vocab_size); logits have V = vocab_size columns.
- `max_seq_len: int` — the longest context (prompt + output) a forward supports; the engine caps its own at this.
- `eos_token_ids: tuple[int, ...]` — ids that end generation (unless a request sets ignore_eos).
- `quantization: str` — "none" or how the matmul weights are stored ("gguf"); reported, never branched on.
- `device: torch.device`, `dtype: torch.dtype` — where and in what dtype the weights live; inputs go to `device`.
- `attention_dtype: torch.dtype` — the dtype of the KV cache, and of the attention math unless the target says
  otherwise (float32 on CPU even for a bf16 model; the native decoder keeps float16 entries and computes in
  float32); `new_cache` allocates in it.
- `fingerprint() -> dict` — what a draft depends on (family, sizes, tokenizer hash); stored in draft checkpoints,
  compared on load. Two targets with equal fingerprints must be interchangeable for a draft.

Text
- `tokenizer` — a Hugging Face tokenizer (training renders conversations with its chat template); the engine and
  the worker use only the three methods below.
- `encode(text) -> list[int]` — a plain prompt, special tokens (BOS) added as the model expects.
- `encode_chat(messages) -> list[int]` — [{"role", "content"}, ...] rendered with the chat template and a
  generation prompt; ValueError (a message for the user) when the target has no chat template.
- `decode(ids) -> str` — special tokens skipped. Must be a pure function of `ids`: the engine's incremental
  detokenizer decodes overlapping windows and diffs them.

Model
- `new_cache(num_slots, max_seq_len) -> SlotCache` — a zeroed KV cache for `num_slots` sequences of up to
  `max_seq_len` positions each.
- `forward(tokens [B, T] long, start [B] long, cache, *, feature_layers=(), logits="all",
  return_final_hidden=False, max_start=None) -> DecoderOutput`:
  - row b holds tokens at positions start[b] .. start[b]+T-1; `cache` is `SlotCache.rows(first, B)` (row b =
    slot first+b) or None (then `tokens` are the whole context, start = 0); the forward writes the T new entries
    of each row into the cache and attends to positions 0 .. start[b]+t of its row;
  - `logits`: "all" → [B, T, V]; "last" → [B, 1, V]; "none" → None; a [B] long tensor of positions → [B, 1, V]
    at that position of each row. Logits are float32;
  - `feature_layers`: indices of layers whose residual outputs are concatenated into `features` [B, T, L·H]
    (in the weights dtype), the hidden states a draft consumes; () → None;
  - `return_final_hidden`: also return `final_hidden` [B, T, H], the post-norm state `lm_head` reads;
  - `max_start`: an upper bound of start (host int), so a backend can size attention without a device sync;
  - `tree_parents` [B, T] long, only where `supports_tree_attention`: the T tokens are a token tree, column 0 the
    root (the row's pending token, parents[b, 0] = -1) and parents[b, i] in [0, i) after it; node i is written at
    start[b] + i, sits at RoPE position start[b] + depth(i) and attends the keys 0 .. start[b]-1 and its own
    ancestors-or-self (deepspec/models/tree_attention.py). None = the ordinary causal chain.
- `supports_tree_attention: bool` — whether `forward` takes `tree_parents` and the cache from `new_cache` has
  `keep_path(start [B], path [B, N], num_accepted [B])`, which moves each row's accepted tree path to consecutive
  positions after its root (the compact_kv op). False: the engine verifies the chain of each tree's first children.
- `multi_token_rows_serial: bool` — whether a pass of several tokens over several rows runs one row at a time (ONNX
  Runtime's attention after a past), so B rows of d + 1 tokens cost B passes: the verification budget prices it so.
- `ragged_rows: bool` — whether `forward` also takes `row_lengths` [B] long (each in [1, T]): row b computes only its
  first row_lengths[b] tokens, bit for bit as a forward of those tokens alone would, and the pass costs the sum of
  the lengths, not B·T; its logits, features and final hidden states past them are zeros and its cache entries past
  them are not written. So a verify pass can give each row its own draft depth. Only such a target is passed
  `row_lengths` (it is not part of `forward`'s signature below, which every target takes); False: every row of a pass
  computes its T tokens.
- `host_threads: int | None` — torch's intra-op threads while the engine steps this target (a target whose forward
  runs in a thread pool of its own asks for 1: deepspec/decoding/host_threads.py); None = torch's own count.
- `recorded_step_curve() -> dict[int, float] | None` — {T: seconds} of a batch-1 verify pass measured for this target
  on this machine before it loaded (an export's record), or None: the verification budget then uses its own curve.
- `lm_head(final_hidden [.., H]) -> [.., V]` — the head alone (training computes target distributions with it).
- `embeddings() -> TargetEmbeddings` — the frozen input embedding and head a neural draft borrows.
- `default_feature_layers(count=5) -> tuple[int, ...]` — `count` layers a draft should read by default.

A test double need not be a Decoder: `isinstance(x, Target)` checks that the members exist (runtime_checkable),
`tests/deepspec/models/test_target_protocol.py` checks `DecoderTarget` against this list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from deepspec.models.arch import ArchSpec
from deepspec.models.decoder import DecoderOutput

__all__ = ["DecoderOutput", "SlotCache", "Target", "TargetEmbeddings", "TreeSlotCache"]


@runtime_checkable
class SlotCache(Protocol):
    """A target's KV cache for the engine's slots; the engine only takes row views and compacts slots."""

    def rows(self, first: int, count: int) -> object:
        """Slots first .. first+count-1 as rows 0..count-1 of one forward (a view, no copy)."""

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Copy positions 0..length-1 of slot src into slot dst (the engine moved that sequence)."""


@runtime_checkable
class TreeSlotCache(SlotCache, Protocol):
    """The cache of a target with `supports_tree_attention`: it also compacts a verified tree's accepted path."""

    def keep_path(self, start: torch.Tensor, path: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """Move row b's accepted nodes path[b, 1 .. num_accepted[b]] (start [B], path [B, N], num_accepted [B]) to
        positions start[b] + 1 .. start[b] + num_accepted[b], after its root."""


@dataclass(frozen=True)
class TargetEmbeddings:
    """The target's frozen token embedding and output head, which neural drafts share instead of learning."""

    #: [V, H] input embedding rows
    embed: torch.Tensor
    #: multiplier applied to embedding rows before layer 0 (sqrt(H) for Gemma, else 1)
    embed_scale: float
    #: [V, H] output head (logits = final_hidden @ head.T); may be the same tensor as embed when tied
    head: torch.Tensor


@runtime_checkable
class Target(Protocol):
    name: str
    spec: ArchSpec
    max_seq_len: int
    eos_token_ids: tuple[int, ...]
    quantization: str

    # read-only: the engine only reads them (a backend sets them as plain class attributes, not ClassVars)

    @property
    def supports_tree_attention(self) -> bool: ...

    @property
    def multi_token_rows_serial(self) -> bool: ...

    @property
    def ragged_rows(self) -> bool: ...

    @property
    def host_threads(self) -> int | None: ...

    @property
    def tokenizer(self) -> object: ...  # a transformers tokenizer

    @property
    def vocab_size(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def attention_dtype(self) -> torch.dtype: ...

    def fingerprint(self) -> dict: ...

    def encode(self, text: str) -> list[int]: ...

    def encode_chat(self, messages: list[dict]) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...

    def new_cache(self, num_slots: int, max_seq_len: int) -> SlotCache: ...

    def forward(
        self,
        tokens: torch.Tensor,  # [B, T] long
        start: torch.Tensor,  # [B] long, first position of each row
        cache: object | None = None,  # SlotCache.rows(first, B) or None
        *,
        feature_layers: tuple[int, ...] = (),
        logits: str | torch.Tensor = "all",
        return_final_hidden: bool = False,
        max_start: int | None = None,
        tree_parents: torch.Tensor | None = None,  # [B, T] long, only where supports_tree_attention
    ) -> DecoderOutput: ...

    def recorded_step_curve(self) -> dict[int, float] | None: ...

    def lm_head(self, final_hidden: torch.Tensor) -> torch.Tensor: ...  # [.., H] -> [.., V]

    def embeddings(self) -> TargetEmbeddings: ...

    def default_feature_layers(self, count: int = 5) -> tuple[int, ...]: ...
