"""4-bit weights in blocks: GGUF's Q4_1 layout of the numbers, for the native CPU decoder (deepspec/models/native/).

Each output channel's inputs come in blocks of 32; a block keeps a scale d and a minimum m (both float16) and a
4-bit level q per weight: w = d * q + m. At 0.625 bytes a weight (against int8's 1) a one-token step, which on a
2-core CPU is bound by reading the weights, reads 40% fewer bytes.

Why this format and not another 4-bit one: the embedded default target ships in it (SmolLM2-135M-Instruct, GGUF
Q4_1), and quantizing its dequantized float32 weights again reproduces the file's own blocks exactly (the block's
minimum is m and its maximum m + 15 d), so the native decoder then computes with the weights of the model as
shipped — no second rounding, unlike int8 (`exact_q4` checks it per matrix). For a float source it is a plain
4-bit quantization, coarser than int8: the native target takes it only when asked (`weights="q4"`).
"""

from __future__ import annotations

import numpy as np

#: inputs per block, as GGUF's Q4_1
BLOCK = 32
#: the largest level: q in 0..15
LEVELS = 15


def quantize_q4(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """weight [N, K] float (K a multiple of BLOCK) → (q [N, K] uint8 in 0..15, d [N, K/32] float16,
    m [N, K/32] float16): per block, m = its minimum and d = (maximum - minimum) / 15 as ggml's Q4_1 quantizer,
    each rounded to float16 first, then q = the nearest level of (w - m) / d."""
    w = np.asarray(weight, dtype=np.float32)
    if w.ndim != 2 or w.shape[1] % BLOCK:
        raise ValueError(f"4-bit blocks need [N, K] weights with K a multiple of {BLOCK}, got {list(w.shape)}")
    blocks = w.reshape(w.shape[0], -1, BLOCK)
    low, high = blocks.min(axis=2), blocks.max(axis=2)
    m = low.astype(np.float16)
    d = ((high - low) / LEVELS).astype(np.float16)
    d32, m32 = d.astype(np.float32), m.astype(np.float32)
    inverse = np.divide(1.0, d32, out=np.zeros_like(d32), where=d32 > 0)
    q = np.floor((blocks - m32[..., None]) * inverse[..., None] + 0.5)
    return np.clip(q, 0, LEVELS).astype(np.uint8).reshape(w.shape), d, m


def dequantize_q4(q: np.ndarray, d: np.ndarray, m: np.ndarray) -> np.ndarray:
    """The float32 weights the blocks stand for, computed as ggml and gguf-py do: (d * q) + m in float32."""
    n, k = q.shape
    levels = q.reshape(n, -1, BLOCK).astype(np.float32)
    return (d.astype(np.float32)[..., None] * levels + m.astype(np.float32)[..., None]).reshape(n, k)


def exact_q4(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """`weight`'s 4-bit blocks (quantize_q4) when they reproduce it bit for bit, as weights dequantized from Q4_1 (a
    GGUF target's) do; None for float ones and for shapes the blocks do not fit."""
    w = np.asarray(weight, dtype=np.float32)
    if w.ndim != 2 or w.shape[1] % BLOCK:
        return None
    blocks = quantize_q4(w)
    return blocks if np.array_equal(dequantize_q4(*blocks), w) else None
