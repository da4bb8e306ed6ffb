"""Counter-based uniforms: the same bits from a row's seed on CPU and in the Triton kernels.

An op that samples takes one int64 seed per row and draws its j-th uniform as a hash of (seed, j), so a row's
result depends on its own seed only (not on batch composition or launch order) and the CPU reference and the
GPU kernel draw identical numbers. The hash is Wellons' `lowbias32` mixer on 32-bit words; the engine draws a
fresh seed per row per step from the request's generator, so seeded requests stay reproducible.

Counters: the acceptance test of draft slot (or tree node) j uses counter 2j, the recovered or bonus token
sampled at slot j uses 2j + 1.
"""

from __future__ import annotations

from typing import overload

import torch

MASK32 = 0xFFFFFFFF
MIX_A, MIX_B = 0x7FEB352D, 0x846CA68B
#: the golden-ratio step and an odd offset spread consecutive counters before mixing
COUNTER_STEP, COUNTER_OFFSET = 0x9E3779B9, 0x632BE5AB


@overload
def mix32(x: int) -> int: ...
@overload
def mix32(x: torch.Tensor) -> torch.Tensor: ...
def mix32(x: torch.Tensor | int) -> torch.Tensor | int:
    """lowbias32 on uint32 values held in int64 tensors or Python ints (products wrap; the low 32 bits stay
    exact)."""
    x = x ^ (x >> 16)
    x = (x * MIX_A) & MASK32
    x = x ^ (x >> 15)
    x = (x * MIX_B) & MASK32
    return x ^ (x >> 16)


@overload
def seed_key(seeds: int) -> int: ...
@overload
def seed_key(seeds: torch.Tensor) -> torch.Tensor: ...
def seed_key(seeds: torch.Tensor | int) -> torch.Tensor | int:
    """[B] int64 seeds (or one, a Python int) → [B] 32-bit keys (both halves of the seed matter)."""
    return mix32(mix32(seeds & MASK32) ^ ((seeds >> 32) & MASK32))


#: draws up to this many on host tensors are hashed in Python integers: the same bits without ~25 small tensor ops
#: (~0.3 ms of a sampled batch-1 step on CPU, where each op runs with the weights' pass still in the caches)
HOST_DRAWS = 256


def host_uniform(key: int, counter: int) -> float:
    """One uniform in Python integers from a row's seed_key and a counter, through the same mix32 (its operators
    work on ints as on tensors): mix32 on values below 2^32 is exact in int64 and in Python alike, and
    (bits >> 8) * 2^-24 is exact in float32, so this is the tensor path's number bit for bit."""
    return (mix32(key ^ mix32((counter * COUNTER_STEP + COUNTER_OFFSET) & MASK32)) >> 8) * (1.0 / (1 << 24))


def _host_uniforms(seeds: list[int], counters: list[list[int]]) -> list[list[float]]:
    """uniforms in Python integers (host_uniform), row by row."""
    out = []
    for seed, row in zip(seeds, counters):
        key = seed_key(seed)
        out.append([host_uniform(key, c) for c in row])
    return out


def uniforms(seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """[B] seeds, [B, n] int64 counters → [B, n] float32 uniforms in [0, 1 - 2^-24] (24 random bits)."""
    if (
        seeds.device.type == "cpu"
        and counters.device.type == "cpu"
        and counters.numel() <= HOST_DRAWS
        and not isinstance(counters, torch._subclasses.FakeTensor)
    ):
        return torch.tensor(_host_uniforms(seeds.tolist(), counters.tolist()), dtype=torch.float32).reshape(
            counters.shape
        )
    key = seed_key(seeds.long())[:, None]
    spread = mix32((counters.long() * COUNTER_STEP + COUNTER_OFFSET) & MASK32)
    return (mix32(key ^ spread) >> 8).to(torch.float32) * (1.0 / (1 << 24))
