"""Keep a GGUF target's 4-bit weights 4-bit, for int4 matmuls on CPU.

Why: batch-1 decode on CPU is memory-bound. Each token streams every weight once. SmolLM2's linears dequantized
to bf16 are 212 MB per token; kept as the GGUF's own 4-bit blocks they are 60 MB. torch's int4 CPU kernel then runs
the 30 layers' matmuls in ~7 ms instead of ~23 ms. This is where llama.cpp gets its speed. The weights are the
file's own. The only new rounding is each 32-weight block's scale and offset, stored in the activation dtype.

How the blocks find their place: transformers renames GGUF tensors and reorders rows (llama.cpp stores q/k rows
interleaved for its RoPE) on the way to the dequantized cache. We do not mirror those rules per architecture.
Each Hugging Face weight is matched to the GGUF tensor whose dequantized rows are the same rows, byte for byte.
That is correct by construction for any row permutation. A tensor that matches nothing stays dense.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

#: weights per block of scale and offset (Q4_0, Q4_1, and Q4_K's sub-blocks)
GROUP_SIZE = 32


@dataclass
class Int4Blocks:
    """A [N, K] weight as 4-bit codes: w[n, k] = (codes[n, k] - 8) * scale[n, g] + zero[n, g], g = k // 32.

    The (codes - 8) form is the one torch's int4 CPU kernel computes; every GGUF 4-bit type maps onto it."""

    codes: torch.Tensor  # [N, K] uint8 in 0..15
    scale: torch.Tensor  # [N, K / 32] float32
    zero: torch.Tensor  # [N, K / 32] float32

    @property
    def shape(self) -> tuple[int, int]:
        rows, cols = self.codes.shape
        return rows, cols

    def dequantize(self) -> torch.Tensor:
        expand = lambda t: t.repeat_interleave(GROUP_SIZE, dim=1)  # noqa: E731  (a one-line local helper)
        return (self.codes.float() - 8) * expand(self.scale) + expand(self.zero)

    def rows(self, index: torch.Tensor) -> Int4Blocks:
        return Int4Blocks(self.codes[index], self.scale[index], self.zero[index])

    @staticmethod
    def cat(parts: list[Int4Blocks]) -> Int4Blocks:
        """Stack along the output dimension (how the decoder fuses q/k/v and gate/up)."""
        return Int4Blocks(*(torch.cat([getattr(p, f) for p in parts]) for f in ("codes", "scale", "zero")))


def _nibbles(qs: np.ndarray, run: int) -> np.ndarray:
    """Packed bytes [n, m] → codes [n, 2m]: each run of `run` bytes holds `run` low nibbles, then the high ones."""
    n = qs.shape[0]
    qs = qs.reshape(n, -1, 1, run) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (qs & np.uint8(0x0F)).reshape(n, -1)


def _f16(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)


def _decode_q4_0(blocks: np.ndarray):  # [n, 18]: d f16, 16 bytes of codes; w = d * (q - 8)
    d = _f16(blocks[:, :2])[:, 0]
    return _nibbles(blocks[:, 2:], 16), d[:, None], np.zeros_like(d)[:, None]


def _decode_q4_1(blocks: np.ndarray):  # [n, 20]: d f16, m f16, 16 bytes; w = d * q + m = d * (q - 8) + (m + 8d)
    d, m = _f16(blocks[:, :2])[:, 0], _f16(blocks[:, 2:4])[:, 0]
    return _nibbles(blocks[:, 4:], 16), d[:, None], (m + 8 * d)[:, None]


def _decode_q4_k(blocks: np.ndarray):  # [n, 144] super-blocks of 256: 8 sub-blocks w = d*sc*q - dmin*m
    from gguf.quants import Q4_K

    d, dmin = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
    sc, m = Q4_K.get_scale_min(blocks[:, 4:16])
    scale = d * sc.astype(np.float32)
    return _nibbles(blocks[:, 16:], 32), scale, 8 * scale - dmin * m.astype(np.float32)


_DECODERS = {"Q4_0": (_decode_q4_0, 18, 32), "Q4_1": (_decode_q4_1, 20, 32), "Q4_K": (_decode_q4_k, 144, 256)}


def decode_tensor(raw: np.ndarray, type_name: str) -> Int4Blocks:
    """A GGUF tensor's raw bytes [N, bytes per row] → Int4Blocks [N, K] in GGUF row order."""
    decode, block_bytes, block_size = _DECODERS[type_name]
    n_rows = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(-1, block_bytes)
    codes, scale, zero = decode(blocks)
    k = blocks.shape[0] // n_rows * block_size
    return Int4Blocks(
        torch.from_numpy(np.ascontiguousarray(codes).reshape(n_rows, k)),
        torch.from_numpy(np.ascontiguousarray(scale, dtype=np.float32).reshape(n_rows, k // GROUP_SIZE)),
        torch.from_numpy(np.ascontiguousarray(zero, dtype=np.float32).reshape(n_rows, k // GROUP_SIZE)),
    )


def int4_weights(gguf_path: Path, state: dict[str, torch.Tensor]) -> dict[str, Int4Blocks]:
    """The 4-bit blocks of every weight in `state` (a GGUF's dequantized float32 state dict) that the GGUF file
    stores as Q4_0, Q4_1 or Q4_K, keyed by the state's names and in the state's row order."""
    from gguf import GGUFReader, dequantize

    by_shape: dict[tuple[int, int], list[str]] = {}
    for name, w in state.items():
        if w.dim() == 2 and w.dtype == torch.float32 and w.shape[1] % GROUP_SIZE == 0:
            by_shape.setdefault((w.shape[0], w.shape[1]), []).append(name)
    found: dict[str, Int4Blocks] = {}
    for tensor in GGUFReader(gguf_path).tensors:
        type_name = tensor.tensor_type.name
        if type_name not in _DECODERS:
            continue
        dense = np.ascontiguousarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        if dense.ndim != 2:
            continue
        row_of = {row.tobytes(): i for i, row in enumerate(dense)}
        for name in by_shape.get(dense.shape, ()):
            if name in found:
                continue
            w = state[name].contiguous().numpy()
            if w[0].tobytes() not in row_of:
                continue
            order = [row_of.get(row.tobytes(), -1) for row in w]
            if min(order) < 0:
                continue
            blocks = decode_tensor(tensor.data, type_name).rows(torch.tensor(order))
            if not torch.allclose(blocks.dequantize(), state[name], rtol=1e-5, atol=1e-7):
                raise ValueError(
                    f"GGUF tensor {tensor.name} ({type_name}) does not decode to {name}; the GGUF file may be corrupt"
                )
            found[name] = blocks
            break
    return found


def cached_int4_weights(gguf_path: Path, target_dir: Path, state: dict[str, torch.Tensor]) -> dict[str, Int4Blocks]:
    """int4_weights, kept beside the dequantized target in the cache (first call ~10 s, later ones a file read)."""
    from safetensors.torch import load_file, save_file

    file = target_dir / "int4.safetensors"
    if file.is_file():
        flat = load_file(file)
        names = {key.rsplit(".", 1)[0] for key in flat}
        return {n: Int4Blocks(unpack_nibbles(flat[n + ".codes"]), flat[n + ".scale"], flat[n + ".zero"]) for n in names}
    found = int4_weights(gguf_path, state)
    flat = {}
    for name, blocks in found.items():
        flat |= {
            name + ".codes": pack_nibbles(blocks.codes),
            name + ".scale": blocks.scale,
            name + ".zero": blocks.zero,
        }
    tmp = file.with_suffix(f".tmp-{id(flat):x}")
    try:
        save_file(flat, tmp)
        tmp.replace(file)  # atomic: a concurrent loader reads the whole file or computes its own
    except OSError:
        tmp.unlink(missing_ok=True)
    return found


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes [N, K] uint8 (K even) → [N, K/2] bytes: code 2i in the low nibble of byte i, 2i + 1 in the high
    one (the int4 cache here and 4-bit-stored drafts, deepspec/models/drafts/storage.py, share it)."""
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """pack_nibbles undone: [N, K/2] bytes → [N, K] codes."""
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(packed.shape[0], -1)
