"""Triton kernels of the tree ops: greedy tree acceptance (one program per row) and KV compaction.

The sampled tree walk keeps a residual distribution over the vocabulary that changes after every rejected
child; it runs as the torch reference on the tensors' device (the launcher routes sampled batches there).
"""

import triton
import triton.language as tl

from plugins.kernels.common import row_max


@triton.jit
def tree_accept_greedy_kernel(tokens_ptr, parents_ptr, num_ptr, logits_ptr, q_ptr, temp_ptr, topk_ptr, topp_ptr,
                              seed_ptr, N, V, out_num_ptr, out_next_ptr, out_path_ptr, BLOCK_N: tl.constexpr,
                              BLOCK_V: tl.constexpr):
    # q, temperature, top_k, top_p and seeds are the op's inputs (TensorRT passes every input); greedy ignores them
    b = tl.program_id(0).to(tl.int64)
    nn = tl.minimum(tl.maximum(tl.load(num_ptr + b), 1), N)
    idx = tl.arange(0, BLOCK_N)
    live = idx < nn
    argmax = tl.zeros([BLOCK_N], tl.int32)
    for i in range(0, nn):
        _, a = row_max(logits_ptr + (b * N + i) * V, 1.0, V, BLOCK_V)
        argmax = tl.where(idx == i, a, argmax)
    parent = tl.maximum(tl.load(parents_ptr + b * N + idx, mask=live, other=0), 0).to(tl.int32)
    token = tl.load(tokens_ptr + b * N + idx, mask=live, other=-1).to(tl.int32)
    accepted = (idx == 0).to(tl.int32)
    depth = tl.zeros([BLOCK_N], tl.int32)
    for i in range(1, nn):  # a parent always comes before its children, so it is settled here
        p = tl.sum(tl.where(idx == i, parent, 0), axis=0)
        t = tl.sum(tl.where(idx == i, token, 0), axis=0)
        ok = (t == tl.sum(tl.where(idx == p, argmax, 0), axis=0)) & (tl.sum(tl.where(idx == p, accepted, 0), axis=0) > 0)
        accepted = tl.where(idx == i, ok.to(tl.int32), accepted)
        depth = tl.where(idx == i, tl.sum(tl.where(idx == p, depth, 0), axis=0) + 1, depth)
    score = tl.where((accepted > 0) & live, depth, -1)
    best_depth = tl.max(score, axis=0)
    best = tl.min(tl.where(score == best_depth, idx, BLOCK_N), axis=0)
    tl.store(out_num_ptr + b, best_depth.to(tl.int64))
    tl.store(out_next_ptr + b, tl.sum(tl.where(idx == best, argmax, 0), axis=0).to(tl.int64))
    tl.store(out_path_ptr + b * N + idx, tl.full([BLOCK_N], -1, tl.int64), mask=idx < N)
    cur = best
    for d in range(0, best_depth + 1):
        tl.store(out_path_ptr + b * N + (best_depth - d), cur.to(tl.int64))
        cur = tl.sum(tl.where(idx == cur, parent, 0), axis=0)


@triton.jit
def compact_kv_kernel(cache_ptr, start_ptr, path_ptr, num_ptr, H, N, stride_l, stride_b, stride_h, stride_s,
                      D, BLOCK_D: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    lh = tl.program_id(1).to(tl.int64)  # one (layer, head) per program
    base = cache_ptr + (lh // H) * stride_l + b * stride_b + (lh % H) * stride_h
    start = tl.load(start_ptr + b)
    n = tl.minimum(tl.maximum(tl.load(num_ptr + b), 0), N - 1)
    offs = tl.arange(0, BLOCK_D)
    for j in range(1, n + 1):  # path[j] >= j: a source is never a slot written before it
        src = tl.load(path_ptr + b * N + j)
        if (src >= 0) & (src != j):
            x = tl.load(base + (start + src) * stride_s + offs, mask=offs < D)
            tl.store(base + (start + j) * stride_s + offs, x, mask=offs < D)
