"""Triton kernels of the tree ops: tree acceptance (one program per row, greedy or sampled) and KV compaction.

Semantics: plugins/reference/tree.py. The sampled walk is SpecInfer's multi-step rejection: the current node's
children are tried in index order against a residual r that starts as the node's processed p and, after each
rejected child, becomes normalize(max(0, r - q_child)). The reference keeps r as a [B, V] tensor; a kernel has
no scratch buffer (a TensorRT AOT plugin gets none), so r is never stored: r(x) is recomputed element-wise from
p(x) and the rejected siblings' q(x), replaying their updates in order with the normalizers Z saved per node in
registers. A rejection costs one pass over the vocabulary per earlier rejected sibling, which a tree's few
children per node keeps small; every draw uses the reference's counter-based uniforms (2i for node i's test,
2c + 1 for the token after the final node c), so kernel and reference commit the same tokens.
"""

import triton
import triton.language as tl

from plugins.kernels.common import float_key, row_max, seed_key, slot_stats, uniform


@triton.jit
def tree_accept_kernel(
    tokens_ptr,
    parents_ptr,
    num_ptr,
    logits_ptr,
    q_ptr,
    temp_ptr,
    topk_ptr,
    topp_ptr,
    seed_ptr,
    N,
    V,
    out_num_ptr,
    out_next_ptr,
    out_path_ptr,
    HAS_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """One row per program: greedy rows (temperature <= 0) take the first deepest accepted node, sampled rows the
    rejection walk. Without HAS_Q every node's q is one-hot at its token (q_ptr is not read)."""
    b = tl.program_id(0).to(tl.int64)
    nn = tl.minimum(tl.maximum(tl.load(num_ptr + b), 1), N).to(tl.int32)
    idx = tl.arange(0, BLOCK_N)
    live = idx < nn
    parent = tl.load(parents_ptr + b * N + idx, mask=live, other=-1).to(tl.int32)
    token = tl.load(tokens_ptr + b * N + idx, mask=live, other=-1).to(tl.int32)
    tl.store(out_path_ptr + b * N + idx, tl.full([BLOCK_N], -1, tl.int64), mask=idx < N)
    tl.store(out_path_ptr + b * N, tl.zeros((), tl.int64))
    T = tl.load(temp_ptr + b)
    row = logits_ptr + b * N * V
    if T <= 0.0:
        _greedy_walk(
            row, parent, token, idx, live, nn, V, b, N, out_num_ptr, out_next_ptr, out_path_ptr, BLOCK_N, BLOCK_V
        )
    else:
        _sampled_walk(
            row,
            q_ptr + b * N * V,
            parent,
            token,
            idx,
            nn,
            T,
            tl.load(topk_ptr + b),
            tl.load(topp_ptr + b),
            seed_key(tl.load(seed_ptr + b)),
            V,
            b,
            N,
            out_num_ptr,
            out_next_ptr,
            out_path_ptr,
            HAS_Q,
            BLOCK_N,
            BLOCK_V,
        )


@triton.jit
def _pick(vec, idx, i):
    """vec[i] of a register vector."""
    return tl.sum(tl.where(idx == i, vec, 0), axis=0)


@triton.jit
def _greedy_walk(
    row,
    parent,
    token,
    idx,
    live,
    nn,
    V,
    b,
    N,
    out_num_ptr,
    out_next_ptr,
    out_path_ptr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    argmax = tl.zeros([BLOCK_N], tl.int32)
    for i in range(0, nn):
        _, a = row_max(row + i * V, 1.0, V, BLOCK_V)
        argmax = tl.where(idx == i, a, argmax)
    parent = tl.maximum(parent, 0)
    accepted = (idx == 0).to(tl.int32)
    depth = tl.zeros([BLOCK_N], tl.int32)
    for i in range(1, nn):  # a parent always comes before its children, so it is settled here
        p = _pick(parent, idx, i)
        # triton tensors at run time (triton.jit)
        parent_accepted = _pick(accepted, idx, p) > 0  # pyright: ignore[reportOperatorIssue]
        ok = (_pick(token, idx, i) == _pick(argmax, idx, p)) & parent_accepted
        accepted = tl.where(idx == i, ok.to(tl.int32), accepted)
        depth = tl.where(idx == i, _pick(depth, idx, p) + 1, depth)
    score = tl.where((accepted > 0) & live, depth, -1)
    best_depth = tl.max(score, axis=0)
    best = tl.min(tl.where(score == best_depth, idx, BLOCK_N), axis=0)
    # triton tensors at run time (triton.jit)
    tl.store(out_num_ptr + b, best_depth.to(tl.int64))  # pyright: ignore[reportAttributeAccessIssue]
    tl.store(out_next_ptr + b, _pick(argmax, idx, best).to(tl.int64))
    cur = best
    # best_depth and cur are triton tensors at run time (triton.jit), not the tuples tl.max/tl.min are typed as
    for d in range(0, best_depth + 1):  # pyright: ignore[reportArgumentType, reportOperatorIssue]
        # triton tensors at run time (triton.jit)
        position = out_path_ptr + b * N + (best_depth - d)  # pyright: ignore[reportOperatorIssue]
        # triton tensors at run time (triton.jit)
        tl.store(position, cur.to(tl.int64))  # pyright: ignore[reportAttributeAccessIssue]
        cur = _pick(parent, idx, cur)


@triton.jit
def _residual(row, q_row, offs, T, zmax, keep, mass, V, parent, token, znorm, idx, cur, upto, HAS_Q: tl.constexpr):
    """r(x) at offs (a vector, or one scalar token): p(x) of node cur, then the update of every rejected child j
    of cur with j < upto, in index order: r = max(0, r - q_j) / Z_j (one-hot q_j: r without token_j, / Z_j).
    Z_j = 0 marks a rejection whose residual was empty, which the reference leaves without an update."""
    ok = (offs >= 0) & (offs < V)
    z = tl.div_rn(tl.load(row + cur * V + offs, mask=ok, other=float("-inf")).to(tl.float32), T)
    r = tl.where((float_key(z) >= keep) & ok, tl.div_rn(tl.exp(z - zmax), mass), 0.0)
    for j in range(cur + 1, upto):
        zj = _pick(znorm, idx, j)
        # triton tensors at run time (triton.jit)
        if (_pick(parent, idx, j) == cur) & (zj > 0.0):  # pyright: ignore[reportOperatorIssue]
            if HAS_Q:
                qj = tl.load(q_row + j * V + offs, mask=ok, other=0.0).to(tl.float32)
                r = tl.div_rn(tl.maximum(r - qj, 0.0), zj)
            else:
                r = tl.div_rn(tl.where(offs == _pick(token, idx, j), 0.0, r), zj)
    return r


@triton.jit
def _sampled_walk(
    row,
    q_row,
    parent,
    token,
    idx,
    nn,
    T,
    top_k,
    top_p,
    key,
    V,
    b,
    N,
    out_num_ptr,
    out_next_ptr,
    out_path_ptr,
    HAS_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    zmax, _, keep, mass = slot_stats(row, T, top_k, top_p, V, BLOCK_V)
    znorm = tl.zeros([BLOCK_N], tl.float32)  # Z of each rejected node's residual update (0: none)
    cur = tl.zeros((), tl.int32)
    depth = tl.zeros((), tl.int32)
    for step in range(1, nn):
        i = step + tl.zeros((), tl.int32)
        if _pick(parent, idx, i) == cur:  # a child of the current node: try it
            t = _pick(token, idx, i)
            # triton tensors at run time (triton.jit)
            in_vocab = (t >= 0) & (t < V)  # pyright: ignore[reportOperatorIssue]
            t_safe = tl.minimum(tl.maximum(t, 0), V - 1)
            p_x = _residual(row, q_row, t_safe, T, zmax, keep, mass, V, parent, token, znorm, idx, cur, i, HAS_Q)
            q_x = 1.0
            if HAS_Q:
                q_x = tl.load(q_row + i * V + t_safe).to(tl.float32)
            if in_vocab & (q_x > 0.0) & (uniform(key, 2 * i) * q_x < p_x):
                cur = i
                depth += 1
                tl.store(out_path_ptr + b * N + depth, i.to(tl.int64))
                zmax, _, keep, mass = slot_stats(row + i * V, T, top_k, top_p, V, BLOCK_V)
            else:  # the sum of what this rejection leaves: the next residual's normalizer
                total = 0.0
                for start in range(0, V, BLOCK_V):
                    offs = start + tl.arange(0, BLOCK_V)
                    r = _residual(row, q_row, offs, T, zmax, keep, mass, V, parent, token, znorm, idx, cur, i, HAS_Q)
                    if HAS_Q:
                        left = tl.maximum(
                            r - tl.load(q_row + i * V + offs, mask=offs < V, other=0.0).to(tl.float32), 0.0
                        )
                    else:
                        left = tl.where(offs == t, 0.0, r)
                    # triton tensors at run time (triton.jit)
                    total += tl.sum(left, axis=0)  # pyright: ignore[reportOperatorIssue]
                znorm = tl.where(idx == i, tl.maximum(total, 0.0), znorm)
    # the next token: inverse CDF of the final residual (the first index whose running sum exceeds u * total)
    total = 0.0
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        total += tl.sum(  # pyright: ignore[reportOperatorIssue]  # triton tensors at run time (triton.jit)
            _residual(row, q_row, offs, T, zmax, keep, mass, V, parent, token, znorm, idx, cur, nn, HAS_Q), axis=0
        )
    target = uniform(key, 2 * cur + 1) * total
    running = 0.0
    found = V
    last = 0
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        w = _residual(row, q_row, offs, T, zmax, keep, mass, V, parent, token, znorm, idx, cur, nn, HAS_Q)
        cum = tl.cumsum(w, axis=0) + running
        found = tl.minimum(found, tl.min(tl.where((cum > target) & (w > 0), offs, V), axis=0))
        last = tl.maximum(last, tl.max(tl.where(w > 0, offs, 0), axis=0))
        running += tl.sum(w, axis=0)  # pyright: ignore[reportOperatorIssue]  # triton tensors at run time (triton.jit)
    tl.store(out_num_ptr + b, depth.to(tl.int64))
    tl.store(out_next_ptr + b, tl.where(found < V, found, last).to(tl.int64))


@triton.jit
def compact_kv_kernel(
    cache_ptr, start_ptr, path_ptr, num_ptr, H, N, stride_l, stride_b, stride_h, stride_s, D, BLOCK_D: tl.constexpr
):
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


@triton.jit
def compact_kv_out_kernel(
    cache_ptr, start_ptr, path_ptr, num_ptr, B, H, S, N, D, out_ptr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr
):
    """compact_kv out of place, for graphs without in-place updates (ONNX, TensorRT): out = cache with the
    accepted nodes' entries moved behind each row's prefix. `cache` and `out` are contiguous [L, B, H, S, D]; as
    every position is read from `cache` and written to `out`, no order of the moves matters."""
    b = tl.program_id(0).to(tl.int64)
    lh = tl.program_id(1).to(tl.int64)  # one (layer, head) per program
    base = (((lh // H) * B + b) * H + lh % H) * S * D
    start = tl.load(start_ptr + b)
    n = tl.minimum(tl.maximum(tl.load(num_ptr + b), 0), N - 1)
    for s0 in range(0, S, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)[:, None].to(tl.int64)
        j = s - start  # depth of the node that lands at s
        moved = (j >= 1) & (j <= n)
        node = tl.load(path_ptr + b * N + tl.minimum(tl.maximum(j, 0), N - 1), mask=moved, other=-1)
        src = tl.where(moved & (node >= 0), start + node, s)
        for d0 in range(0, D, BLOCK_D):  # any head_dim with one compiled tile width
            d = d0 + tl.arange(0, BLOCK_D)[None, :]
            ok = (s < S) & (d < D)
            x = tl.load(cache_ptr + base + src * D + d, mask=ok)
            tl.store(out_ptr + base + s * D + d, x, mask=ok)
