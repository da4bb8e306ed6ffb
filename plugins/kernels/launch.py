"""Launchers: allocate outputs, pick block sizes and grids, run the kernels. Tensors may be on CUDA, or on CPU
under TRITON_INTERPRET=1 (how the tests run them). Inputs are checked by plugins.library before they get here."""

from __future__ import annotations

import torch
import triton

from plugins.kernels.chain import (
    confidence_truncate_kernel,
    greedy_accept_kernel,
    process_logits_kernel,
    rejection_sample_kernel,
)
from plugins.kernels.tree import compact_kv_kernel, compact_kv_out_kernel, tree_accept_kernel

MAX_BLOCK_V = 4096


def block_v(V: int) -> int:
    return min(triton.next_power_of_2(max(V, 1)), MAX_BLOCK_V)


def warps(V: int) -> int:
    return 8 if block_v(V) >= 2048 else 4


def greedy_accept(draft_tokens, num_draft_tokens, target_logits):
    B, k = draft_tokens.shape
    V = target_logits.shape[-1]
    out_num = torch.empty(B, dtype=torch.int64, device=draft_tokens.device)
    out_next = torch.empty_like(out_num)
    greedy_accept_kernel[(B,)](
        draft_tokens.contiguous(),
        num_draft_tokens.contiguous(),
        target_logits.contiguous(),
        k,
        V,
        out_num,
        out_next,
        BLOCK_V=block_v(V),
        # a launch option; triton types kernel[grid] as the kernel
        num_warps=warps(V),  # pyright: ignore[reportCallIssue]
    )
    return out_num, out_next


def rejection_sample(draft_tokens, num_draft_tokens, target_logits, draft_probs, temperature, top_k, top_p, seeds):
    B, k = draft_tokens.shape
    V = target_logits.shape[-1]
    out_num = torch.empty(B, dtype=torch.int64, device=draft_tokens.device)
    out_next = torch.empty_like(out_num)
    q = draft_probs.contiguous() if draft_probs is not None else target_logits  # never read without HAS_Q
    rejection_sample_kernel[(B,)](
        draft_tokens.contiguous(),
        num_draft_tokens.contiguous(),
        target_logits.contiguous(),
        q,
        temperature.contiguous(),
        top_k.contiguous(),
        top_p.contiguous(),
        seeds.contiguous(),
        k,
        V,
        out_num,
        out_next,
        HAS_Q=draft_probs is not None,
        BLOCK_V=block_v(V),
        # a launch option; triton types kernel[grid] as the kernel
        num_warps=warps(V),  # pyright: ignore[reportCallIssue]
    )
    return out_num, out_next


def process_logits(logits, temperature, top_k, top_p):
    B, T, V = logits.shape
    out = torch.empty(B, T, V, dtype=torch.float32, device=logits.device)
    if B * T:
        process_logits_kernel[(B * T,)](
            logits.contiguous(),
            temperature.contiguous(),
            top_k.contiguous(),
            top_p.contiguous(),
            T,
            V,
            out,
            BLOCK_V=block_v(V),
            # a launch option; triton types kernel[grid] as the kernel
            num_warps=warps(V),  # pyright: ignore[reportCallIssue]
        )
    return out


def tree_accept(
    tree_tokens,
    parents,
    num_nodes,
    target_logits,
    draft_probs,
    temperature,
    top_k,
    top_p,
    seeds,
    block_n: int | None = None,
):
    """`block_n` sets the kernel's tree lanes (BLOCK_N, default the next power of two of N): the ahead-of-time
    build compiles a few sizes (plugins.aot.AOT_NODE_BLOCKS), and tests run those exact variants here."""
    B, N = tree_tokens.shape
    V = target_logits.shape[-1]
    out_num = torch.empty(B, dtype=torch.int64, device=tree_tokens.device)
    out_next = torch.empty_like(out_num)
    out_path = torch.empty(B, N, dtype=torch.int64, device=tree_tokens.device)
    logits = target_logits.contiguous()
    q = draft_probs.contiguous() if draft_probs is not None else logits  # never read without HAS_Q
    tree_accept_kernel[(B,)](
        tree_tokens.contiguous(),
        parents.contiguous(),
        num_nodes.contiguous(),
        logits,
        q,
        temperature.contiguous(),
        top_k.contiguous(),
        top_p.contiguous(),
        seeds.contiguous(),
        N,
        V,
        out_num,
        out_next,
        out_path,
        HAS_Q=draft_probs is not None,
        BLOCK_N=block_n or triton.next_power_of_2(N),
        BLOCK_V=block_v(V),
        # a launch option; triton types kernel[grid] as the kernel
        num_warps=warps(V),  # pyright: ignore[reportCallIssue]
    )
    return out_num, out_next, out_path


def compact_kv(cache, start, path, num_accepted):
    L, B, H, S, D = cache.shape
    if cache.stride(4) != 1:
        raise ValueError("deepspec::compact_kv: the cache's last dim (head_dim) must be contiguous")
    compact_kv_kernel[(B, L * H)](
        cache,
        start.contiguous(),
        path.contiguous(),
        num_accepted.contiguous(),
        H,
        path.shape[1],
        cache.stride(0),
        cache.stride(1),
        cache.stride(2),
        cache.stride(3),
        D,
        # a tl.constexpr parameter takes a plain value at launch
        BLOCK_D=triton.next_power_of_2(D),  # pyright: ignore[reportArgumentType]
    )


def compact_kv_out(cache, start, path, num_accepted):
    """The out-of-place compact_kv (the TensorRT plugin's kernel): → a new cache, `cache` untouched."""
    L, B, H, S, D = cache.shape
    cache = cache.contiguous()
    out = torch.empty_like(cache)
    if cache.numel():
        compact_kv_out_kernel[(B, L * H)](
            cache,
            start.contiguous(),
            path.contiguous(),
            num_accepted.contiguous(),
            B,
            H,
            S,
            path.shape[1],
            D,
            out,
            BLOCK_S=16,  # pyright: ignore[reportArgumentType]  # a tl.constexpr parameter takes a plain value at launch
            # a tl.constexpr parameter takes a plain value at launch
            BLOCK_D=min(triton.next_power_of_2(D), 64),  # pyright: ignore[reportArgumentType]
        )
    return out


def confidence_truncate(confidence, num_draft_tokens, threshold, block_k: int | None = None):
    """`block_k` sets the kernel's slot lanes (BLOCK_K, default the next power of two of k), as tree_accept's
    `block_n` does."""
    B, k = confidence.shape
    out_num = torch.empty(B, dtype=torch.int64, device=confidence.device)
    out_surv = torch.empty(B, k, dtype=torch.float32, device=confidence.device)
    if k == 0:
        return out_num.zero_(), out_surv
    confidence_truncate_kernel[(B,)](
        confidence.contiguous(),
        num_draft_tokens.contiguous(),
        k,
        out_num,
        out_surv,
        # a tl.constexpr parameter takes a plain value at launch
        THRESHOLD=float(threshold),  # pyright: ignore[reportArgumentType]
        # a tl.constexpr parameter takes a plain value at launch
        BLOCK_K=block_k or triton.next_power_of_2(k),  # pyright: ignore[reportArgumentType]
    )
    return out_num, out_surv
