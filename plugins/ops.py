"""The functions callers use: `torch.ops.deepspec.*` in eager, torch.compile and torch.export; custom ONNX
nodes while `torch.onnx.export(..., dynamo=True)` traces them.

Shapes and dtypes (B rows, k draft slots, N tree nodes, V vocabulary; every count and id int64):

    greedy_accept(draft_tokens [B,k], num_draft_tokens [B], target_logits [B,k+1,V] float)
        -> num_accepted [B], next_token [B]
    rejection_sample(draft_tokens [B,k], num_draft_tokens [B], target_logits [B,k+1,V] float,
                     draft_probs [B,k,V] float | None, temperature [B] f32, top_k [B], top_p [B] f32, seeds [B])
        -> num_accepted [B], next_token [B]
    process_logits(logits [B,T,V] float, temperature [B] f32, top_k [B], top_p [B] f32) -> probs [B,T,V] f32
    tree_accept(tree_tokens [B,N], parents [B,N], num_nodes [B], target_logits [B,N,V] float,
                draft_probs [B,N,V] float | None, temperature [B] f32, top_k [B], top_p [B] f32, seeds [B])
        -> num_accepted [B], next_token [B], path [B,N]
    compact_kv(cache [L,B,H,S,D], start [B], path [B,N], num_accepted [B]) -> cache (updated in place)
    confidence_truncate(confidence [B,k] float, num_draft_tokens [B], threshold) -> num_kept [B], survival [B,k]

Semantics are documented on the reference implementations in plugins/reference/.
"""

from __future__ import annotations

import torch
from torch import Tensor

import plugins.library  # noqa: F401 - registers torch.ops.deepspec.*
from plugins import checks
from plugins.reference.accept import greedy_walk, rejection_walk

_ops = torch.ops.deepspec


def _exporting() -> bool:
    return torch.onnx.is_in_onnx_export()


def greedy_accept(draft_tokens: Tensor, num_draft_tokens: Tensor, target_logits: Tensor) -> tuple[Tensor, Tensor]:
    if _exporting():
        from plugins.onnx_ops import symbolic

        num_accepted, next_token = symbolic(
            "greedy_accept", [draft_tokens, num_draft_tokens, target_logits], B=draft_tokens.shape[0]
        )
        return num_accepted, next_token
    return _ops.greedy_accept(draft_tokens, num_draft_tokens, target_logits)


def greedy_accept_host(draft_tokens, num_draft_tokens, target_logits) -> tuple[list[int], list[int]]:
    """greedy_accept on host logits (plugins.reference.accept.on_host), as Python lists (num_accepted, next_token),
    without the dispatcher: the op's CPU kernel is this same walk, and dispatching it plus the engine's tensors
    around it cost ~0.15 ms of a ~8 ms batch-1 round on the native decoder. The op's checks run all the same."""
    checks.chain("greedy_accept", draft_tokens, num_draft_tokens, target_logits)
    return greedy_walk(draft_tokens, num_draft_tokens, target_logits)


def rejection_sample_host(
    draft_tokens, num_draft_tokens, target_logits, draft_probs, temperature, top_k, top_p, seeds
) -> tuple[list[int], list[int]]:
    """rejection_sample on host logits (plugins.reference.accept.on_host), as Python lists (num_accepted,
    next_token), without the dispatcher: the same draws as the op's CPU kernel (rejection_walk says why it is
    cheaper). The op's checks run all the same."""
    checks.chain("rejection_sample", draft_tokens, num_draft_tokens, target_logits, draft_probs)
    checks.sampling("rejection_sample", draft_tokens.shape[0], temperature, top_k, top_p, seeds)
    return rejection_walk(draft_tokens, num_draft_tokens, target_logits, draft_probs, temperature, top_k, top_p, seeds)


# the arguments' types are plugins.library's op schema (the module docstring lists them)
def rejection_sample(
    draft_tokens, num_draft_tokens, target_logits, draft_probs, temperature, top_k, top_p, seeds
) -> tuple[Tensor, Tensor]:
    if _exporting():
        from plugins.onnx_ops import absent, symbolic

        q = absent() if draft_probs is None else draft_probs
        num_accepted, next_token = symbolic(
            "rejection_sample",
            [draft_tokens, num_draft_tokens, target_logits, q, temperature, top_k, top_p, seeds],
            B=draft_tokens.shape[0],
            attrs={"has_draft_probs": int(draft_probs is not None)},
        )
        return num_accepted, next_token
    return _ops.rejection_sample(
        draft_tokens, num_draft_tokens, target_logits, draft_probs, temperature, top_k, top_p, seeds
    )


def process_logits(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    if _exporting():
        from plugins.onnx_ops import symbolic

        return symbolic("process_logits", [logits, temperature, top_k, top_p], shape=logits.shape)[0]
    return _ops.process_logits(logits, temperature, top_k, top_p)


def tree_accept(
    tree_tokens, parents, num_nodes, target_logits, draft_probs, temperature, top_k, top_p, seeds
) -> tuple[Tensor, Tensor, Tensor]:
    if _exporting():
        from plugins.onnx_ops import absent, symbolic

        q = absent() if draft_probs is None else draft_probs
        num_accepted, next_token, path = symbolic(
            "tree_accept",
            [tree_tokens, parents, num_nodes, target_logits, q, temperature, top_k, top_p, seeds],
            B=tree_tokens.shape[0],
            shape=tree_tokens.shape,
            attrs={"has_draft_probs": int(draft_probs is not None)},
        )
        return num_accepted, next_token, path
    return _ops.tree_accept(
        tree_tokens, parents, num_nodes, target_logits, draft_probs, temperature, top_k, top_p, seeds
    )


def compact_kv(cache: Tensor, start: Tensor, path: Tensor, num_accepted: Tensor) -> Tensor:
    """In place in eager; an ONNX graph has no in-place update, so there the node returns the new cache."""
    if _exporting():
        from plugins.onnx_ops import symbolic

        return symbolic("compact_kv", [cache, start, path, num_accepted], shape=cache.shape, dtype=cache.dtype)[0]
    _ops.compact_kv(cache, start, path, num_accepted)
    return cache


def confidence_truncate(confidence: Tensor, num_draft_tokens: Tensor, threshold: float) -> tuple[Tensor, Tensor]:
    if _exporting():
        from plugins.onnx_ops import symbolic

        num_kept, survival = symbolic(
            "confidence_truncate",
            [confidence, num_draft_tokens],
            B=confidence.shape[0],
            shape=confidence.shape,
            attrs={"threshold": float(threshold)},
        )
        return num_kept, survival
    return _ops.confidence_truncate(confidence, num_draft_tokens, float(threshold))
