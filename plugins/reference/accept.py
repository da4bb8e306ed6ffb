"""Chain verification on CPU: greedy acceptance, the Leviathan/Chen rejection rule, DSpark's confidence cut.

Words (after vLLM's rejection sampler, arXiv 2211.17192): *accepted* drafts survive verification; the
*recovered* token replaces the first rejected draft, drawn from the residual normalize(max(0, p - q)); the
*bonus* token follows a fully accepted block, drawn from p. A step commits accepted + 1 tokens.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from plugins.reference.logits import process, scale
from plugins.reference.rng import host_uniform, seed_key, uniforms

#: the smallest normal float32: a draft probability q is clamped to it before p / q (as the kernels do)
_TINY = torch.finfo(torch.float32).tiny


def greedy_accept(
    draft_tokens: torch.Tensor,  # [B, k] int64
    num_draft_tokens: torch.Tensor,  # [B] int64 in [0, k]
    target_logits: torch.Tensor,  # [B, k+1, V] float
) -> tuple[torch.Tensor, torch.Tensor]:
    """→ (num_accepted [B], next_token [B]): the longest prefix equal to the target's argmax, then its argmax.

    Slot by slot over the rows still accepting (like the kernel): a row's argmax is taken only up to its first
    mismatch, so weak drafts cost one pass over the vocabulary instead of k + 1. Ties go to the lowest id, like
    target-only decoding.
    """
    if on_host(target_logits):
        return _greedy_accept_host(draft_tokens, num_draft_tokens, target_logits)
    return _greedy_accept_torch(draft_tokens, num_draft_tokens, target_logits)


def _greedy_accept_torch(draft_tokens, num_draft_tokens, target_logits) -> tuple[torch.Tensor, torch.Tensor]:
    """greedy_accept in torch ops, on any device."""
    B, k = draft_tokens.shape
    num_accepted = torch.zeros(B, dtype=torch.long, device=draft_tokens.device)
    if k == 0:  # target-only decoding, every step of it: the argmax alone (the general path costs ~2x at batch 1)
        return num_accepted, target_logits[:, 0].argmax(dim=-1)
    next_token = torch.zeros(B, dtype=torch.long, device=draft_tokens.device)
    settled = torch.zeros(B, dtype=torch.bool, device=draft_tokens.device)
    alive = (num_draft_tokens > 0).nonzero().squeeze(1)
    for j in range(k):
        if not alive.numel():
            break
        argmax = _slot(target_logits, alive, j).argmax(dim=-1)
        ok = draft_tokens[alive, j] == argmax
        num_accepted[alive] += ok.long()
        # a mismatch settles the row: the target's own token is the argmax just taken
        next_token[alive[~ok]], settled[alive[~ok]] = argmax[~ok], True
        alive = alive[ok & (num_draft_tokens[alive] > j + 1)]
    rest = (~settled).nonzero().squeeze(1)  # no drafts, or every draft accepted: the argmax after the block
    if rest.numel():
        next_token[rest] = target_logits[rest, num_accepted[rest]].argmax(dim=-1)
    return num_accepted, next_token


def _greedy_accept_host(draft_tokens, num_draft_tokens, target_logits) -> tuple[torch.Tensor, torch.Tensor]:
    num_accepted, next_token = greedy_walk(draft_tokens, num_draft_tokens, target_logits)
    return torch.tensor(num_accepted, dtype=torch.long), torch.tensor(next_token, dtype=torch.long)


def greedy_walk(draft_tokens, num_draft_tokens, target_logits) -> tuple[list[int], list[int]]:
    """greedy_accept on logits in host memory, row by row over NumPy views: the same walk, at a fraction of the
    cost, as Python lists (num_accepted, next_token). torch's argmax over a 49,152-wide row takes ~45 us on one
    thread and NumPy's ~4 us, and each torch op on the small index tensors costs microseconds of dispatch: at batch 1
    the torch path took ~0.33 ms a round of a ~10 ms decode step, this one ~0.02 ms. NumPy's argmax also takes the
    first of tied maxima."""
    logits = target_logits.detach().numpy()
    drafts, counts = draft_tokens.tolist(), num_draft_tokens.tolist()
    num_accepted, next_token = [], []
    for row, (draft, count) in enumerate(zip(drafts, counts)):
        j, token = _greedy_row(logits[row], draft, count)
        num_accepted.append(j)
        next_token.append(token)
    return num_accepted, next_token


def _greedy_row(logits, draft: list[int], count: int) -> tuple[int, int]:
    """One row of greedy_walk on its [k+1, V] NumPy logits: (drafts accepted, the target's next token). The argmax
    is taken only up to the first mismatch, as on the device path."""
    j = 0
    while True:
        token = int(logits[j].argmax())
        if j < count and draft[j] == token:
            j += 1
            continue
        return j, token


def on_host(x: torch.Tensor) -> bool:
    """Real values in host memory that NumPy reads without a copy: the host paths above take them."""
    return (
        x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.float64, torch.float16)
        and not isinstance(x, torch._subclasses.FakeTensor)
    )


def _slot(target_logits: torch.Tensor, rows: torch.Tensor, j: int) -> torch.Tensor:
    """[len(rows), V] logits of slot j: a view while every row is still in (gathering copies the rows)."""
    return target_logits[:, j] if rows.numel() == target_logits.shape[0] else target_logits[rows, j]


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
    """→ (num_accepted [B], next_token [B]), next_token being the recovered or the bonus token: each row walks its
    drafts until one is rejected (`_walk_drafts`), a row that rejected none takes p at the bonus slot
    (`_take_bonus_slot`), and the next token is drawn from the residual or p (`_next_token_weights`)."""
    greedy = temperature <= 0
    rows = _RowSampling(greedy, torch.where(greedy, torch.ones_like(temperature), temperature), top_k, top_p, seeds)
    if draft_tokens.shape[1] == 0:
        return _sample_bonus_only(target_logits, rows)
    stop = _walk_drafts(draft_tokens, num_draft_tokens, target_logits, draft_probs, rows)
    _take_bonus_slot(stop, target_logits, rows)
    weights = _next_token_weights(stop, draft_tokens, draft_probs)
    next_token = sample_index(weights, uniforms(seeds, (2 * stop.num_accepted + 1)[:, None]).squeeze(1))
    if bool(greedy.any()):
        next_token = torch.where(greedy, stop.argmax, next_token)
    return stop.num_accepted, next_token


class _RowSampling(NamedTuple):
    """Each row's sampling: greedy [B] bool, the temperature logits are divided by [B] (1 for greedy rows), top-k,
    top-p and the seed its uniforms are drawn from."""

    greedy: torch.Tensor
    scale_by: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    seeds: torch.Tensor


class _Stop(NamedTuple):
    """Where each row's walk through its drafts stopped, and the target's distribution there (filled in place)."""

    num_accepted: torch.Tensor  # [B] int64
    rejected: torch.Tensor  # [B] bool: stopped at a rejected draft (else: at the bonus slot after its drafts)
    weights: torch.Tensor  # [B, V] the processed p there, unnormalized
    mass: torch.Tensor  # [B] that p's total weight
    argmax: torch.Tensor  # [B] int64 the argmax there (read for greedy rows)


def _sample_bonus_only(target_logits: torch.Tensor, rows: _RowSampling) -> tuple[torch.Tensor, torch.Tensor]:
    """Target-only sampling (no drafts), every step of it: the bonus draw alone, as the general path draws it."""
    B = target_logits.shape[0]
    z = scale(target_logits[:, 0], rows.scale_by)
    bonus = sample_index(
        process(z, rows.top_k, rows.top_p).weights(),
        uniforms(rows.seeds, torch.ones(B, 1, dtype=torch.long, device=z.device)).squeeze(1),
    )
    if bool(rows.greedy.any()):
        bonus = torch.where(rows.greedy, z.argmax(dim=-1), bonus)
    return torch.zeros(B, dtype=torch.long, device=z.device), bonus


def _walk_drafts(
    draft_tokens: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    draft_probs: torch.Tensor | None,
    rows: _RowSampling,
) -> _Stop:
    """Accept drafts slot by slot over the rows still accepting: a row's distribution is processed only up to its
    first rejection, so a step costs (accepted + 1) passes over the vocabulary per row, not k + 1; a rejected row
    keeps the distribution it was rejected on, which is the one its recovered token is drawn from."""
    B, k = draft_tokens.shape
    dev, V = draft_tokens.device, target_logits.shape[-1]
    u = uniforms(rows.seeds, (2 * torch.arange(k, device=dev))[None, :].expand(B, k))
    if draft_probs is None:
        q_draft = torch.ones(B, k, device=dev)
    else:
        q_draft = draft_probs.gather(2, draft_tokens[..., None]).squeeze(2).to(torch.float32)
    stop = _Stop(
        torch.zeros(B, dtype=torch.long, device=dev),
        torch.zeros(B, dtype=torch.bool, device=dev),
        torch.ones(B, V, device=dev),
        torch.ones(B, device=dev),
        torch.zeros(B, dtype=torch.long, device=dev),
    )
    alive = (num_draft_tokens > 0).nonzero().squeeze(1)
    for j in range(k):
        if not alive.numel():
            break
        z = scale(_slot(target_logits, alive, j), rows.scale_by[alive])
        token = draft_tokens[alive, j]
        row_greedy = rows.greedy[alive]
        proc, argmax = None, None
        if bool(row_greedy.any()):
            argmax = z.argmax(dim=-1)
        if bool(row_greedy.all()):
            ok = token == argmax
        else:
            proc = process(z, rows.top_k[alive], rows.top_p[alive])
            p = proc.probs_at(token[:, None]).squeeze(1)
            q = q_draft[alive, j]
            # accept with probability min(1, p / q); a q of 0 never accepts
            ratio = torch.where(q > 0, p / q.clamp(min=_TINY), torch.zeros_like(p))
            ok = u[alive, j] < ratio
            if argmax is not None:
                ok = torch.where(row_greedy, token == argmax, ok)
        stop.num_accepted[alive] += ok.long()
        if not bool(ok.all()):
            stopped = alive[~ok]
            stop.rejected[stopped] = True
            if argmax is not None:
                stop.argmax[stopped] = argmax[~ok]
            if proc is not None:
                stop.weights[stopped], stop.mass[stopped] = proc.weights()[~ok], proc.mass[~ok]
        alive = alive[ok & (num_draft_tokens[alive] > j + 1)]
    return stop


def _take_bonus_slot(stop: _Stop, target_logits: torch.Tensor, rows: _RowSampling) -> None:
    """Rows with no drafts or every draft accepted stop at the bonus slot after their block: its p, into `stop`."""
    rest = (~stop.rejected).nonzero().squeeze(1)
    if rest.numel():
        z = scale(target_logits[rest, stop.num_accepted[rest]], rows.scale_by[rest])
        proc = process(z, rows.top_k[rest], rows.top_p[rest])
        stop.weights[rest], stop.mass[rest] = proc.weights(), proc.mass
        if bool(rows.greedy.any()):
            stop.argmax[rest] = z.argmax(dim=-1)


def _next_token_weights(stop: _Stop, draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None) -> torch.Tensor:
    """[B, V] what each row's next token is drawn from: p at the bonus slot, or after a rejection the residual
    normalize(max(0, p - q)) (unnormalized where the draw does not need it)."""
    B, k = draft_tokens.shape
    rejected = stop.rejected
    slot = stop.num_accepted.clamp(max=max(k - 1, 0))
    if draft_probs is None or not bool(rejected.any()):
        # sampling needs no normalization; with a one-hot q the residual is p without the rejected draft (never
        # empty: a draft holding all of p's mass is always accepted)
        weights = stop.weights
        if k and bool(rejected.any()):
            rows = rejected.nonzero().squeeze(1)
            weights[rows, draft_tokens[rows, slot[rows]]] = 0.0
        return weights
    p_at = stop.weights / stop.mass[:, None]
    dev = draft_tokens.device
    residual = (p_at - draft_probs[torch.arange(B, device=dev), slot].to(torch.float32)).clamp_(min=0.0)
    # p == q exactly leaves no residual; rejection then had probability 0, so p itself is the fallback
    usable = rejected & (residual.sum(dim=-1) > 0)
    # a row that was not rejected keeps its unnormalized p, as where no row was rejected: a row's draw does not
    # depend on the other rows
    return torch.where(usable[:, None], residual, torch.where(rejected[:, None], p_at, stop.weights))


def rejection_walk(
    draft_tokens, num_draft_tokens, target_logits, draft_probs, temperature, top_k, top_p, seeds
) -> tuple[list[int], list[int]]:
    """rejection_sample on logits in host memory (`on_host`), row by row, as Python lists (num_accepted,
    next_token): the batched path's draws bit for bit, without its bookkeeping. A sampled row goes through the same
    scale / process / probs_at / weights / sample_index on its own [1, V] slots, in the same float32 arithmetic,
    with its uniforms hashed in Python integers (rng.host_uniform); a greedy row takes greedy_walk's argmax. The
    batched path spends a dozen small tensor ops per slot finding which rows are still accepting, and fills a
    [B, V] buffer for the rows' last distributions; each op costs tens of microseconds right after a target forward
    has streamed the weights through the caches. At batch 1 on the native decoder that was about half of a sampled
    round's verification (bench.round_overhead --temperatures 0,1)."""
    drafts, counts = draft_tokens.tolist(), num_draft_tokens.tolist()
    temperatures, seed_list = temperature.tolist(), seeds.tolist()
    host = None
    num_accepted, next_token = [], []
    for row, (draft, count) in enumerate(zip(drafts, counts)):
        if temperatures[row] <= 0:  # greedy row: the argmax rule, as greedy_walk
            if host is None:
                host = target_logits.detach().numpy()
            j, token = _greedy_row(host[row], draft, count)
            num_accepted.append(j)
            next_token.append(token)
            continue
        key, rows = seed_key(seed_list[row]), slice(row, row + 1)
        j = 0
        while True:
            proc = process(scale(target_logits[rows, j], temperature[rows]), top_k[rows], top_p[rows])
            if j == count:  # every draft accepted (or none proposed): the bonus token, drawn from p
                weights = proc.weights()
                break
            token = draft[j]
            p = proc.probs_at(torch.tensor([[token]]))
            q = 1.0 if draft_probs is None else float(draft_probs[row, j, token])
            # accept with probability min(1, p / q), the quotient in float32 as the batched path takes it
            if q > 0 and host_uniform(key, 2 * j) < float(p / torch.tensor(max(q, _TINY), dtype=torch.float32)):
                j += 1
                continue
            if draft_probs is None:  # one-hot q: the residual is p without the rejected draft
                weights = proc.weights()
                weights[0, token] = 0.0
            else:
                p_at = proc.weights() / proc.mass[:, None]
                residual = (p_at - draft_probs[rows, j].to(torch.float32)).clamp_(min=0.0)
                # p == q exactly leaves no residual; rejection then had probability 0, so p itself is the fallback
                weights = residual if bool(residual.sum() > 0) else p_at
            break
        num_accepted.append(j)
        next_token.append(_sample_row(weights[0], host_uniform(key, 2 * j + 1)))
    return num_accepted, next_token


def _sample_row(weights: torch.Tensor, u: float) -> int:
    """sample_index of one row ([V] weights) with the search on the host: the same cumsum, the same float32
    product u * total and the same searches, without four more tensor ops."""
    cum = weights.cumsum(dim=-1).numpy()
    index = int(np.searchsorted(cum, np.float32(u) * cum[-1], side="right"))
    return index if index < len(cum) else int(np.searchsorted(cum, cum[-1], side="left"))


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
    keep = (survival >= threshold) & (torch.arange(k, device=confidence.device)[None, :] < num_draft_tokens[:, None])
    num_kept = keep.long().cumprod(dim=1).sum(dim=1)
    survival = survival * (torch.arange(k, device=confidence.device)[None, :] < num_kept[:, None])
    return num_kept, survival
