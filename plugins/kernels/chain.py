"""Triton kernels of the chain ops: one program per row, walking its draft slots in order.

Parameters come in TensorRT's AOT order: input pointers, then integer scalars, then output pointers (constexprs
last). A row stops at its first rejection, so a step costs (accepted + 1) passes over the vocabulary per row instead of
k + 1; nothing returns to the host until the two [B] outputs are read. Semantics: plugins/reference/accept.py.
"""

import triton
import triton.language as tl

from plugins.kernels.common import float_key, prob_of, row_max, sample_slot, seed_key, slot_stats, uniform


@triton.jit
def greedy_accept_kernel(draft_ptr, num_ptr, logits_ptr, K, V, out_num_ptr, out_next_ptr, BLOCK_V: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    n = tl.minimum(tl.maximum(tl.load(num_ptr + b), 0), K)
    row = logits_ptr + b * (K + 1) * V
    j = 0
    _, argmax = row_max(row, 1.0, V, BLOCK_V)
    going = j < n
    while going:
        token = tl.load(draft_ptr + b * K + j)
        if token == argmax:
            j += 1
            _, argmax = row_max(row + j * V, 1.0, V, BLOCK_V)
            going = j < n
        else:
            going = j < 0
    # a triton tensor at run time (triton.jit)
    tl.store(out_num_ptr + b, j.to(tl.int64))  # pyright: ignore[reportAttributeAccessIssue]
    # a triton tensor at run time (triton.jit)
    tl.store(out_next_ptr + b, argmax.to(tl.int64))  # pyright: ignore[reportAttributeAccessIssue]


@triton.jit
def rejection_sample_kernel(
    draft_ptr,
    num_ptr,
    logits_ptr,
    q_ptr,
    temp_ptr,
    topk_ptr,
    topp_ptr,
    seed_ptr,
    K,
    V,
    out_num_ptr,
    out_next_ptr,
    HAS_Q: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    n = tl.minimum(tl.maximum(tl.load(num_ptr + b), 0), K)
    T = tl.load(temp_ptr + b)
    greedy = T <= 0.0
    T = tl.where(greedy, 1.0, T)
    top_k = tl.load(topk_ptr + b)
    top_p = tl.load(topp_ptr + b)
    key = seed_key(tl.load(seed_ptr + b))
    row = logits_ptr + b * (K + 1) * V
    j = 0
    zmax, argmax, keep, mass = slot_stats(row, T, top_k, top_p, V, BLOCK_V)
    token = tl.full((), 0, tl.int64)
    rejected = 0
    going = j < n
    while going:
        token = tl.load(draft_ptr + b * K + j)
        if greedy:
            ok = token == argmax
        else:
            p = prob_of(row + j * V, token, T, zmax, keep, mass, V)
            q = 1.0
            if HAS_Q:
                q = tl.load(q_ptr + (b * K + j) * V + tl.minimum(tl.maximum(token, 0), V - 1)).to(tl.float32)
            ok = (q > 0.0) & (uniform(key, 2 * j) < p / tl.maximum(q, 1.1754943508222875e-38))
        if ok:
            j += 1
            zmax, argmax, keep, mass = slot_stats(row + j * V, T, top_k, top_p, V, BLOCK_V)
            going = j < n
        else:
            rejected = 1
            going = j < 0
    if greedy:
        next_token = argmax
    else:
        next_token = sample_slot(
            row + j * V,
            q_ptr + (b * K + tl.minimum(j, K - 1)) * V,
            T,
            zmax,
            keep,
            mass,
            V,
            rejected,
            token,
            uniform(key, 2 * j + 1),
            HAS_Q,
            BLOCK_V,
        )
    # a triton tensor at run time (triton.jit)
    tl.store(out_num_ptr + b, j.to(tl.int64))  # pyright: ignore[reportAttributeAccessIssue]
    # a triton tensor at run time (triton.jit)
    tl.store(out_next_ptr + b, next_token.to(tl.int64))  # pyright: ignore[reportAttributeAccessIssue]


@triton.jit
def process_logits_kernel(logits_ptr, temp_ptr, topk_ptr, topp_ptr, T_LEN, V, out_ptr, BLOCK_V: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)  # one (row, position) per program
    b = r // T_LEN
    T = tl.load(temp_ptr + b)
    greedy = T <= 0.0
    T = tl.where(greedy, 1.0, T)
    row = logits_ptr + r * V
    zmax, argmax, keep, mass = slot_stats(row, T, tl.load(topk_ptr + b), tl.load(topp_ptr + b), V, BLOCK_V)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        z = tl.div_rn(tl.load(row + offs, mask=offs < V, other=float("-inf")).to(tl.float32), T)
        p = tl.where(float_key(z) >= keep, tl.exp(z - zmax) / mass, 0.0)
        p = tl.where(greedy, tl.where(offs == argmax, 1.0, 0.0), p)
        tl.store(out_ptr + r * V + offs, p, mask=offs < V)


@triton.jit
def confidence_truncate_kernel(
    conf_ptr, num_ptr, K, out_num_ptr, out_surv_ptr, THRESHOLD: tl.constexpr, BLOCK_K: tl.constexpr
):
    b = tl.program_id(0).to(tl.int64)
    n = tl.minimum(tl.maximum(tl.load(num_ptr + b), 0), K)
    offs = tl.arange(0, BLOCK_K)
    c = tl.load(conf_ptr + b * K + offs, mask=offs < K, other=1.0).to(tl.float32)
    survival = tl.cumprod(c, axis=0)
    weak = ((survival < THRESHOLD) | (offs >= n)) & (offs < K)
    kept = tl.min(tl.where(weak, offs, K), axis=0)
    kept = tl.minimum(kept, n)
    tl.store(out_num_ptr + b, kept.to(tl.int64))
    tl.store(out_surv_ptr + b * K + offs, tl.where(offs < kept, survival, 0.0), mask=offs < K)
