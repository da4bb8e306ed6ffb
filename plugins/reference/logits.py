"""Logits processing without a full sort: temperature, then top-k, then top-p, as one keep-threshold per row.

Definitions shared by every implementation (the Triton kernels compute the same quantities):

    z      = logits / T                          (T <= 0 marks a greedy row: p is one-hot at argmax)
    tau_k  = the top_k-th largest z              (-inf when top_k is 0 or >= V)
    e      = exp(z - max z) where z >= tau_k, else 0
    tau_p  = the largest value v of z with sum(e[z >= v]) >= top_p * sum(e)   (-inf when top_p == 1)
    tau    = max(tau_k, tau_p);  keep = z >= tau;  p = e * keep / sum(e * keep)

Ties at a cut are all kept (a sort-based filter keeps an arbitrary subset of them); otherwise this is exactly
the sorted-cumsum nucleus: the token whose mass crosses top_p is kept.

Why no sort: sorting [B, k+1, 49152] dominated a sampled verify step on CPU (~240 ms at batch 8). tau_k comes
from `topk` (linear in V for small k), and tau_p from a mass histogram over 2,048 bins of z followed by an
exact ordering of the one bin where the cumulative mass crosses the line (a few hundred tokens at most on
real logits), so the whole filter is a handful of passes over the logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NUM_BINS = 2048


@dataclass
class Processed:
    """One processed distribution per row, kept implicit: p(x) = [z_x >= tau] * exp(z_x - zmax) / mass."""

    z: torch.Tensor  # [R, V] float32 scaled logits
    zmax: torch.Tensor  # [R]
    tau: torch.Tensor  # [R] keep z >= tau
    mass: torch.Tensor  # [R] sum of exp(z - zmax) over the kept tokens
    #: [R, V] exp(z - zmax) when process() already computed it for every row (handed over by weights())
    e: torch.Tensor | None = None

    def probs_at(self, tokens: torch.Tensor) -> torch.Tensor:
        """[R, n] token ids → [R, n] processed probabilities of those tokens."""
        zt = self.z.gather(1, tokens)
        p = torch.exp(zt - self.zmax[:, None]) / self.mass[:, None]
        return torch.where(zt >= self.tau[:, None], p, torch.zeros_like(p))

    def weights(self) -> torch.Tensor:
        """[R, V] unnormalized p (exp(z - zmax) on the kept tokens, 0 elsewhere), a tensor the caller owns."""
        e, self.e = self.e, None
        if e is None:
            e = torch.exp(self.z - self.zmax[:, None])
        if bool(torch.isfinite(self.tau).any()):
            e.masked_fill_(self.z < self.tau[:, None], 0.0)
        return e

    def probs(self) -> torch.Tensor:
        """[R, V] the full processed distribution."""
        return self.weights().div_(self.mass[:, None])


def scale(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """[R, V] logits / [R] temperature → float32 z; greedy rows (T <= 0) are scaled by 1."""
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).to(torch.float32)
    if bool((t == 1).all()):  # nothing to scale: callers never write into z
        return logits.to(torch.float32)
    return logits.to(torch.float32) / t[:, None]


def process(z: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> Processed:
    """Thresholds and kept mass of each row of z ([R, V] float32); top_k [R] int64, top_p [R] float32."""
    R, V = z.shape
    zmax = z.amax(dim=-1)
    tau = torch.full((R,), float("-inf"), dtype=torch.float32, device=z.device)
    if (
        top_k.device.type == "cpu"
        and not isinstance(top_k, torch._subclasses.FakeTensor)
        and R <= 64
        and all(k <= 0 or k >= V for k in top_k.tolist())
        and all(p >= 1 for p in top_p.tolist())
    ):
        # no row filters (the default sampling): the general path's last branch for every row, without the ~6
        # index ops that find which rows take which branch (each ~tens of us on CPU after a target's forward)
        e = torch.exp(z - zmax[:, None])
        return Processed(z, zmax, tau, e.sum(dim=-1), e)
    k_rows = ((top_k > 0) & (top_k < V)).nonzero().squeeze(1)
    if k_rows.numel():
        kk = top_k[k_rows]
        vals = _rows(z, k_rows).topk(int(kk.max()), dim=-1).values
        tau[k_rows] = vals.gather(1, (kk - 1)[:, None]).squeeze(1)
    mass = torch.empty(R, dtype=torch.float32, device=z.device)
    e_all = None
    p_rows = (top_p < 1).nonzero().squeeze(1)
    if p_rows.numel():
        tau_p, mass_p, e = _top_p(_rows(z, p_rows), zmax[p_rows], tau[p_rows], top_p[p_rows])
        tau[p_rows], mass[p_rows] = tau_p, mass_p
        e_all = e if p_rows.numel() == R else None
    rest = (top_p >= 1).nonzero().squeeze(1)
    if rest.numel():
        zr, zmax_r, tau_r = _rows(z, rest), zmax[rest], tau[rest]
        e = torch.exp(zr - zmax_r[:, None])
        if bool(torch.isfinite(tau_r).any()):
            e.masked_fill_(zr < tau_r[:, None], 0.0)
        mass[rest] = e.sum(dim=-1)
        e_all = e if rest.numel() == R else None
    return Processed(z, zmax, tau, mass, e_all)


def _rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    return x if rows.numel() == x.shape[0] else x[rows]


def _top_p(z: torch.Tensor, zmax: torch.Tensor, tau_k: torch.Tensor, top_p: torch.Tensor):
    """Exact tau_p and kept mass for [r, V] rows: histogram of the mass by z, then order only the crossing bin."""
    r, V = z.shape
    e = torch.exp(z - zmax[:, None])
    if bool(torch.isfinite(tau_k).any()):
        e.masked_fill_(z < tau_k[:, None], 0.0)
    lo = torch.maximum(z.amin(dim=-1), tau_k)
    width = (zmax - lo) / NUM_BINS
    inv_width = torch.where(width > 0, 1.0 / width, torch.zeros_like(width))
    # bin 0 holds the largest z; tokens cut by top-k fall into the last bin with zero mass
    bins = (zmax[:, None] - z).mul_(inv_width[:, None]).clamp_(0, NUM_BINS - 1).to(torch.int64)
    flat = bins + (torch.arange(r, device=z.device) * NUM_BINS)[:, None]
    hist = torch.bincount(flat.view(-1), weights=e.view(-1), minlength=r * NUM_BINS).view(r, NUM_BINS)
    cum = hist.cumsum(dim=-1)  # float64: bincount with weights sums in double
    target = top_p.to(torch.float64) * cum[:, -1]
    crossing = (cum < target[:, None]).sum(dim=-1).clamp_(max=NUM_BINS - 1)
    before = (cum.gather(1, crossing[:, None]) - hist.gather(1, crossing[:, None])).squeeze(1)
    # only the crossing bin needs an order; zero-mass tokens can never be where the mass crosses the line
    candidate = (bins == crossing[:, None]) & (e > 0)
    n = max(int(candidate.sum(dim=-1).max()), 1)
    vals = torch.where(candidate, z, torch.full_like(z, float("-inf"))).topk(n, dim=-1).values  # [r, n] desc
    ev = torch.exp(vals - zmax[:, None]).to(torch.float64)
    cum_c = before[:, None] + ev.cumsum(dim=-1)
    at = (cum_c < target[:, None]).sum(dim=-1).clamp_(max=n - 1)
    tau = vals.gather(1, at[:, None]).squeeze(1)
    mass = before + (ev * (vals >= tau[:, None])).sum(dim=-1)
    return tau, mass.to(torch.float32), e


def process_logits(
    logits: torch.Tensor,  # [B, T, V] float (any float dtype)
    temperature: torch.Tensor,  # [B] float32, <= 0 = greedy
    top_k: torch.Tensor,  # [B] int64, 0 = off
    top_p: torch.Tensor,  # [B] float32 in (0, 1], 1 = off
) -> torch.Tensor:
    """[B, T, V] float32 processed distribution p (one-hot at argmax for greedy rows)."""
    B, T, V = logits.shape
    rows = lambda x: x.repeat_interleave(T)  # noqa: E731 - per-row parameters for each of the T positions
    flat = logits.reshape(B * T, V)
    z = scale(flat, rows(temperature))
    probs = process(z, rows(top_k), rows(top_p)).probs()
    greedy = rows(temperature <= 0)
    if bool(greedy.any()):
        one_hot = torch.zeros_like(probs).scatter_(1, flat.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(greedy[:, None], one_hot, probs)
    return probs.view(B, T, V)
