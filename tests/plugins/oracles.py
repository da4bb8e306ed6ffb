"""Independent oracles for the plugins tests: the sort-based filter and a distribution check of one verify step."""

from __future__ import annotations

import torch
from scipy.stats import chisquare

from bench.verify import old_sampling_probs


def sorted_filter_probs(logits, temperature, top_k, top_p):
    """[B, T, V] → p by sorting: top-k then the top-p prefix, softmax. The engine's pre-plugins filter, which
    bench/verify.py keeps as its old path, so the benchmark and the tests compare against the same oracle."""
    return old_sampling_probs(logits, temperature, top_k, top_p)


def step_p_values(
    rejection_sample, *, rows=4000, V=6, k=2, with_q=True, top_k=0, top_p=1.0, temperature=1.0, seed=0
) -> tuple[float, float]:
    """Chi-square p-values that one verify step commits tokens from the processed target distribution.

    Every row holds the same target logits per slot and its own drafts (drawn from q, or a fixed token when
    with_q is False) and seed. Lossless verification makes the first committed token ~ p_0 and, over the rows
    that accepted their first draft, the second ~ p_1. Returns (p-value of token 0, p-value of token 1).
    """
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(1, k + 1, V, generator=g) * 1.5).expand(rows, k + 1, V).contiguous()
    T = torch.full((rows,), temperature)
    tk = torch.full((rows,), top_k, dtype=torch.long)
    tp = torch.full((rows,), top_p)
    p = sorted_filter_probs(logits[:1], T[:1], tk[:1], tp[:1])[0]  # [k+1, V]
    if with_q:
        q1 = torch.softmax(torch.randn(k, V, generator=g), dim=-1)
        draft_probs = q1.expand(rows, k, V).contiguous()
        drafts = torch.multinomial(q1.repeat(rows, 1), 1, generator=g).view(rows, k)
    else:
        draft_probs = None
        drafts = p[:k].argsort(dim=-1)[:, -2].expand(rows, k).contiguous()  # a plausible but wrong guess
    num = torch.full((rows,), k, dtype=torch.long)
    seeds = torch.randint(2**62, (rows,), generator=g)
    accepted, next_token = rejection_sample(drafts, num, logits, draft_probs, T, tk, tp, seeds)
    first = torch.where(accepted > 0, drafts[:, 0], next_token)
    if k < 2:
        return _p_value(first, p[0]), 1.0
    second = torch.where(accepted > 1, drafts[:, 1], next_token)[accepted > 0]
    return _p_value(first, p[0]), _p_value(second, p[1])


def _p_value(tokens: torch.Tensor, p: torch.Tensor) -> float:
    n = tokens.numel()
    counts = torch.bincount(tokens, minlength=p.numel()).double()
    assert float(counts[p == 0].sum()) == 0, "a token outside the processed support was committed"
    live = p * n >= 5
    observed = torch.cat([counts[live], counts[~live].sum()[None]])
    expected = torch.cat([p[live].double() * n, (p[~live].double() * n).sum()[None]])
    keep = expected > 0
    if int(keep.sum()) < 2:  # one token holds all the mass: the support check above was the whole test
        return 1.0
    return float(
        chisquare(
            observed[keep].numpy(), expected[keep].numpy() * observed.sum().item() / expected[keep].sum().item()
        ).pvalue
    )


def accept_everything(drafts, num, logits, draft_probs, temperature, top_k, top_p, seeds):
    """A wrong verifier for the negative control: every draft accepted, the bonus sampled from p."""
    from plugins import reference

    B = drafts.shape[0]
    tail = logits[torch.arange(B), num][:, None]
    bonus = reference.rejection_sample(
        drafts[:, :0], torch.zeros_like(num), tail, None, temperature, top_k, top_p, seeds
    )[1]
    return num, bonus
