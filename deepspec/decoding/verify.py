"""Verification: which draft tokens the target accepts, and the token it adds itself.

Words used throughout (after vLLM's rejection_sampler, arXiv 2211.17192): *accepted* draft tokens survive
verification; the *recovered* token replaces the first rejected draft (sampled from the residual
normalize(max(0, p - q))); the *bonus* token follows a fully accepted block (sampled from p). Each round commits
accepted + 1 tokens, so the output distribution is exactly the target's.
"""

from __future__ import annotations

import torch


def greedy_verify(
    draft_tokens: torch.Tensor,  # [B, k]
    num_draft_tokens: torch.Tensor,  # [B]
    target_argmax: torch.Tensor,  # [B, k+1]
) -> torch.Tensor:
    """[B] number of accepted drafts: the longest prefix where the draft equals the target's argmax."""
    k = draft_tokens.shape[1]
    if k == 0:
        return torch.zeros(draft_tokens.shape[0], dtype=torch.long)
    in_range = torch.arange(k)[None, :] < num_draft_tokens[:, None]
    match = (draft_tokens == target_argmax[:, :k]) & in_range
    return match.long().cumprod(dim=1).sum(dim=1)


def rejection_verify_row(
    draft_tokens: list[int],  # the row's real drafts (length n <= k)
    target_probs: torch.Tensor,  # [n+1, V] processed target distribution p at each slot
    draft_probs: torch.Tensor | None,  # [n, V] distribution q each draft was drawn from; None = one-hot
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """Leviathan/Chen rejection rule for one row → (accepted count, recovered-or-bonus token)."""
    n = len(draft_tokens)
    uniforms = torch.rand(n, generator=generator).tolist() if n else []
    for j, token in enumerate(draft_tokens):
        p = float(target_probs[j, token])
        q = 1.0 if draft_probs is None else float(draft_probs[j, token])
        # q >= p: accept with probability p/q; q < p: always accept
        if q > 0 and uniforms[j] < min(1.0, p / q):
            continue
        if draft_probs is None:
            residual = target_probs[j].clone()
            residual[token] = 0.0
        else:
            residual = (target_probs[j] - draft_probs[j]).clamp_(min=0.0)
        total = float(residual.sum())
        if total <= 0.0:  # p == q exactly: rejection had probability 0, fall back to p
            residual, total = target_probs[j], 1.0
        recovered = int(torch.multinomial(residual / total, 1, generator=generator))
        return j, recovered
    bonus = int(torch.multinomial(target_probs[n], 1, generator=generator))
    return n, bonus
