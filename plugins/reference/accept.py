"""Chain verification on CPU: greedy acceptance, the Leviathan/Chen rejection rule, DSpark's confidence cut.

Words (after vLLM's rejection sampler, arXiv 2211.17192): *accepted* drafts survive verification; the
*recovered* token replaces the first rejected draft, drawn from the residual normalize(max(0, p - q)); the
*bonus* token follows a fully accepted block, drawn from p. A step commits accepted + 1 tokens.
"""

from __future__ import annotations

import torch

from plugins.reference.logits import process, scale
from plugins.reference.rng import uniforms


def greedy_accept(
    draft_tokens: torch.Tensor,  # [B, k] int64
    num_draft_tokens: torch.Tensor,  # [B] int64 in [0, k]
    target_logits: torch.Tensor,  # [B, k+1, V] float
) -> tuple[torch.Tensor, torch.Tensor]:
    """→ (num_accepted [B], next_token [B]): the longest prefix equal to the target's argmax, then its argmax."""
    k = draft_tokens.shape[1]
    argmax = target_logits.argmax(dim=-1)  # [B, k+1]; ties go to the lowest id, like target-only decoding
    match = (draft_tokens == argmax[:, :k]) & (torch.arange(k)[None, :] < num_draft_tokens[:, None])
    num_accepted = match.long().cumprod(dim=1).sum(dim=1)
    return num_accepted, argmax.gather(1, num_accepted[:, None]).squeeze(1)


def sample_index(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """[R, V] nonnegative weights (each row with a positive sum), [R] uniforms → [R] inverse-CDF draws.

    The draw is the first index whose running sum exceeds u * total, so it always has positive weight; a u that
    rounds onto the total lands on the last token with weight.
    """
    cum = weights.cumsum(dim=-1)
    total = cum[:, -1:].contiguous()
    idx = torch.searchsorted(cum, u[:, None] * total, right=True)
    last = torch.searchsorted(cum, total)  # first index where the sum is complete
    return torch.minimum(idx, last).squeeze(1)


def rejection_sample(
    draft_tokens: torch.Tensor,  # [B, k] int64
    num_draft_tokens: torch.Tensor,  # [B] int64 in [0, k]
    target_logits: torch.Tensor,  # [B, k+1, V] float, raw (processing happens here)
    draft_probs: torch.Tensor | None,  # [B, k, V] float: the q each draft was drawn from; None = one-hot q
    temperature: torch.Tensor,  # [B] float32; <= 0 = greedy row (exact argmax rule)
    top_k: torch.Tensor,  # [B] int64, 0 = off
    top_p: torch.Tensor,  # [B] float32, 1 = off
    seeds: torch.Tensor,  # [B] int64
) -> tuple[torch.Tensor, torch.Tensor]:
    """→ (num_accepted [B], next_token [B]), next_token being the recovered or the bonus token."""
    B, k = draft_tokens.shape
    V = target_logits.shape[-1]
    rows = lambda x: x.repeat_interleave(k + 1)  # noqa: E731 - per-row parameters for each slot
    z = scale(target_logits.reshape(B * (k + 1), V), rows(temperature))
    proc = process(z, rows(top_k), rows(top_p))
    slots = torch.arange(k)
    greedy = temperature <= 0
    any_greedy = bool(greedy.any())
    argmax = z.view(B, k + 1, V).argmax(dim=-1) if any_greedy else None  # [B, k+1]

    # acceptance of every draft at once: u < p(x) / q(x); a q of 0 never accepts
    ends = torch.arange(B * (k + 1)).view(B, k + 1)[:, :k]  # flat row of each draft slot
    p_draft = torch.zeros(B, k)
    if k:
        z_draft = z.view(B, k + 1, V)[:, :k].gather(2, draft_tokens[..., None]).squeeze(2)
        p_draft = torch.exp(z_draft - proc.zmax[ends]) / proc.mass[ends]
        p_draft = torch.where(z_draft >= proc.tau[ends], p_draft, torch.zeros_like(p_draft))
    if draft_probs is None:
        q_draft = torch.ones_like(p_draft)
    else:
        q_draft = draft_probs.gather(2, draft_tokens[..., None]).squeeze(2).to(torch.float32)
    u = uniforms(seeds, (2 * slots)[None, :].expand(B, k))
    ratio = torch.where(q_draft > 0, p_draft / q_draft.clamp(min=torch.finfo(torch.float32).tiny),
                        torch.zeros_like(p_draft))
    accept = u < ratio
    if any_greedy:
        accept = torch.where(greedy[:, None], draft_tokens == argmax[:, :k], accept)
    accept &= slots[None, :] < num_draft_tokens[:, None]
    num_accepted = accept.long().cumprod(dim=1).sum(dim=1)

    # one distribution per row at the first rejected slot (recovered) or after the block (bonus)
    at = torch.arange(B) * (k + 1) + num_accepted
    z_at = z[at]
    p_at = torch.exp(z_at - proc.zmax[at, None]).masked_fill_(z_at < proc.tau[at, None], 0.0)
    p_at.div_(proc.mass[at, None])
    rejected = num_accepted < num_draft_tokens
    weights = p_at
    if bool(rejected.any()):
        slot = num_accepted.clamp(max=max(k - 1, 0))
        if draft_probs is None:
            token = draft_tokens.gather(1, slot[:, None]) if k else torch.zeros(B, 1, dtype=torch.long)
            residual = p_at.scatter(1, token, 0.0)
        else:
            residual = (p_at - draft_probs[torch.arange(B), slot].to(torch.float32)).clamp_(min=0.0)
        # p == q exactly leaves no residual; rejection then had probability 0, so p itself is the fallback
        usable = rejected & (residual.sum(dim=-1) > 0)
        weights = torch.where(usable[:, None], residual, p_at)
    next_token = sample_index(weights, uniforms(seeds, (2 * num_accepted + 1)[:, None]).squeeze(1))
    if any_greedy:
        next_token = torch.where(greedy, argmax.gather(1, num_accepted[:, None]).squeeze(1), next_token)
    return num_accepted, next_token


def confidence_truncate(
    confidence: torch.Tensor,  # [B, k] float: c_j ~ P(slot j accepted | every earlier slot accepted)
    num_draft_tokens: torch.Tensor,  # [B] int64 in [0, k]
    threshold: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """→ (num_kept [B], survival [B, k]): cut each block before the first slot whose survival prod(c) < threshold.

    survival[b, j] = c_0 * ... * c_j for the kept slots and 0 past them, ready to be a Proposal's survival.
    """
    k = confidence.shape[1]
    survival = confidence.to(torch.float32).cumprod(dim=1)
    keep = (survival >= threshold) & (torch.arange(k)[None, :] < num_draft_tokens[:, None])
    num_kept = keep.long().cumprod(dim=1).sum(dim=1)
    survival = survival * (torch.arange(k)[None, :] < num_kept[:, None])
    return num_kept, survival
