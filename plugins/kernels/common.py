"""Triton building blocks shared by the kernels: the counter-based RNG, per-slot statistics of a processed
distribution (argmax, keep-threshold, kept mass) and inverse-CDF sampling over a vocabulary row.

They compute exactly the quantities of plugins/reference/ (rng.py, logits.py), streaming the vocabulary in
BLOCK_V chunks so one program handles one row without a scratch buffer. Thresholds are found by binary search
over the order-preserving integer key of float32 (32 steps at most, exact), not by sorting.
"""

import triton
import triton.language as tl

MASK32 = tl.constexpr(0xFFFFFFFF)
MIX_A = tl.constexpr(0x7FEB352D)
MIX_B = tl.constexpr(0x846CA68B)
COUNTER_STEP = tl.constexpr(0x9E3779B9)
COUNTER_OFFSET = tl.constexpr(0x632BE5AB)
KEY_OFF = tl.constexpr(-2147483648)  # a key below every float's: "no threshold"


@triton.jit
def mix32(x):
    """lowbias32 in int64 lanes holding uint32 values (as the reference does in torch)."""
    x = x ^ (x >> 16)
    x = (x * MIX_A) & MASK32
    x = x ^ (x >> 15)
    x = (x * MIX_B) & MASK32
    return x ^ (x >> 16)


@triton.jit
def seed_key(seed):
    seed = seed.to(tl.int64)
    return mix32(mix32(seed & MASK32) ^ ((seed >> 32) & MASK32))


@triton.jit
def uniform(key, counter):
    """The reference's uniforms(seed, counter): 24 random bits → float32 in [0, 1)."""
    spread = mix32((counter.to(tl.int64) * COUNTER_STEP + COUNTER_OFFSET) & MASK32)
    return (mix32(key ^ spread) >> 8).to(tl.float32) * (1.0 / 16777216.0)


@triton.jit
def float_key(x):
    """float32 → int32 whose signed order is the float order."""
    bits = x.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def row_max(ptr, T, V, BLOCK_V: tl.constexpr):
    """(max of z = x / T, first index of it) over a row of V logits."""
    best = float("-inf")
    best_idx = 0
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        z = tl.div_rn(tl.load(ptr + offs, mask=offs < V, other=float("-inf")).to(tl.float32), T)
        m = tl.max(z, axis=0)
        i = tl.min(tl.where((z == m) & (offs < V), offs, V), axis=0)
        better = m > best  # pyright: ignore[reportOperatorIssue]  # triton types tl.max/tl.sum as tensor | tuple
        best_idx = tl.where(better, i, best_idx)
        best = tl.where(better, m, best)
    return best, best_idx


@triton.jit
def _count_at_least(ptr, T, V, key, BLOCK_V: tl.constexpr):
    n = 0
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        z = tl.div_rn(tl.load(ptr + offs, mask=offs < V, other=float("-inf")).to(tl.float32), T)
        counted = ((float_key(z) >= key) & (offs < V)).to(tl.int32)
        # triton types tl.max/tl.sum as tensor | tuple
        n += tl.sum(counted, axis=0)  # pyright: ignore[reportOperatorIssue]
    return n


@triton.jit
def _mass_at_least(ptr, T, V, zmax, key, BLOCK_V: tl.constexpr):
    total = 0.0
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        z = tl.div_rn(tl.load(ptr + offs, mask=offs < V, other=float("-inf")).to(tl.float32), T)
        keep = (float_key(z) >= key) & (offs < V)
        # triton types tl.max/tl.sum as tensor | tuple
        total += tl.sum(tl.where(keep, tl.exp(z - zmax), 0.0), axis=0)  # pyright: ignore[reportOperatorIssue]
    return total


@triton.jit
def slot_stats(ptr, T, top_k, top_p, V, BLOCK_V: tl.constexpr):
    """→ (zmax, argmax, keep key, kept mass) of one row: p(x) = [key(z_x) >= keep] exp(z_x - zmax) / mass."""
    zmax, argmax = row_max(ptr, T, V, BLOCK_V)
    keep = KEY_OFF
    if (top_k > 0) & (top_k < V):  # the largest key with at least top_k values at or above it: the k-th value
        lo = tl.full((), KEY_OFF, tl.int64)
        hi = float_key(zmax).to(tl.int64)
        while lo < hi:
            mid = lo + (hi - lo + 1) // 2
            if _count_at_least(ptr, T, V, mid.to(tl.int32), BLOCK_V) >= top_k:
                lo = mid
            else:
                hi = mid - 1
        keep = lo.to(tl.int32)
    mass = _mass_at_least(ptr, T, V, zmax, keep, BLOCK_V)
    if top_p < 1.0:  # the largest key whose mass at or above reaches top_p of the top-k mass
        target = top_p * mass
        lo = tl.full((), keep, tl.int32).to(tl.int64)
        hi = float_key(zmax).to(tl.int64)
        while lo < hi:
            mid = lo + (hi - lo + 1) // 2
            if _mass_at_least(ptr, T, V, zmax, tl.maximum(mid.to(tl.int32), keep), BLOCK_V) >= target:
                lo = mid
            else:
                hi = mid - 1
        keep = tl.maximum(lo.to(tl.int32), keep)
        mass = _mass_at_least(ptr, T, V, zmax, keep, BLOCK_V)
    return zmax, argmax, keep, mass


@triton.jit
def prob_of(ptr, token, T, zmax, keep, mass, V):
    """Processed probability of one token (0 for an id outside [0, V))."""
    ok = (token >= 0) & (token < V)
    z = tl.div_rn(tl.load(ptr + tl.where(ok, token, 0)).to(tl.float32), T)
    p = tl.exp(z - zmax) / mass
    return tl.where(ok & (float_key(z) >= keep), p, 0.0)


@triton.jit
def _weights(ptr, q_ptr, offs, T, zmax, keep, mass, V, residual, drop_token, HAS_Q: tl.constexpr):
    z = tl.div_rn(tl.load(ptr + offs, mask=offs < V, other=float("-inf")).to(tl.float32), T)
    p = tl.where((float_key(z) >= keep) & (offs < V), tl.exp(z - zmax) / mass, 0.0)
    if residual:
        if HAS_Q:
            p = tl.maximum(p - tl.load(q_ptr + offs, mask=offs < V, other=0.0).to(tl.float32), 0.0)
        else:
            p = tl.where(offs == drop_token, 0.0, p)
    return p


@triton.jit
def sample_slot(
    ptr, q_ptr, T, zmax, keep, mass, V, residual, drop_token, u, HAS_Q: tl.constexpr, BLOCK_V: tl.constexpr
):
    """Inverse-CDF draw from p (residual = 0) or from normalize(max(0, p - q)) / p without drop_token (residual =
    1), falling back to p when the residual is empty; the first index whose running sum exceeds u * total."""
    total = 0.0
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        w = _weights(ptr, q_ptr, offs, T, zmax, keep, mass, V, residual, drop_token, HAS_Q)
        # triton types tl.max/tl.sum as tensor | tuple
        total += tl.sum(w, axis=0)  # pyright: ignore[reportOperatorIssue]
    if total <= 0.0:
        residual = 0
        total = 0.0
        for start in range(0, V, BLOCK_V):
            offs = start + tl.arange(0, BLOCK_V)
            w = _weights(ptr, q_ptr, offs, T, zmax, keep, mass, V, 0, drop_token, HAS_Q)
            # triton types tl.max/tl.sum as tensor | tuple
            total += tl.sum(w, axis=0)  # pyright: ignore[reportOperatorIssue]
    target = u * total
    running = 0.0
    found = V
    last = 0
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        w = _weights(ptr, q_ptr, offs, T, zmax, keep, mass, V, residual, drop_token, HAS_Q)
        cum = tl.cumsum(w, axis=0) + running
        hit = tl.min(tl.where((cum > target) & (w > 0), offs, V), axis=0)
        found = tl.minimum(found, hit)
        last = tl.maximum(last, tl.max(tl.where(w > 0, offs, 0), axis=0))
        # triton types tl.max/tl.sum as tensor | tuple
        running += tl.sum(w, axis=0)  # pyright: ignore[reportOperatorIssue]
    return tl.where(found < V, found, last)
