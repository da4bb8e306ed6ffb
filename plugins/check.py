"""`python -m plugins check`: every op's Triton kernel against the CPU reference on a CUDA device, with timings.

Cases are random batches at serving sizes plus the edges (nothing accepted, everything accepted, k = 0, V = 1,
argmax ties, filters on and off, one-node and fully branching trees, greedy and sampled trees with and without q,
the in-place and the out-of-place KV compaction). Greedy outputs must be equal; sampled
outputs too, because both implementations draw the same counter-based uniforms (a handful of rows may differ
where float rounding moves a uniform across a boundary, so up to 1% of rows is tolerated there).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

#: what an op returns: one tensor or several
Outputs = torch.Tensor | tuple[torch.Tensor, ...]


class NoCudaError(RuntimeError):
    """`check` needs a CUDA device."""


@dataclass
class CaseResult:
    op: str
    case: str
    ok: bool
    detail: str
    kernel_ms: float
    reference_ms: float


def _time(fn: Callable[..., Outputs], args: list, device: torch.device) -> tuple[tuple[torch.Tensor, ...], float]:
    """(fn(*args)'s outputs as a tuple, milliseconds per call over 5 warm calls)."""
    out = fn(*args)
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(5):
        out = fn(*args)
    torch.cuda.synchronize(device)
    return out if isinstance(out, tuple) else (out,), (time.perf_counter() - t0) / 5 * 1e3


def _cases(device):
    g = torch.Generator().manual_seed(0)
    for B, k, V in ((8, 7, 49152), (3, 0, 100), (4, 3, 1), (64, 4, 32000)):
        logits = torch.randn(B, k + 1, V, generator=g) * 3
        drafts = logits[:, :k].argmax(-1) if k else torch.zeros(B, 0, dtype=torch.long)
        if k:
            drafts[: B // 2, k // 2] = (drafts[: B // 2, k // 2] + 1) % max(V, 1)
        num = torch.randint(0, k + 1, (B,), generator=g)
        q = torch.softmax(torch.randn(B, k, V, generator=g), -1)
        temp = torch.rand(B, generator=g) + 0.3
        temp[0] = 0.0
        top_k = torch.where(torch.rand(B, generator=g) < 0.5, torch.randint(1, 64, (B,), generator=g), 0)
        top_p = torch.where(torch.rand(B, generator=g) < 0.5, torch.rand(B, generator=g) * 0.9 + 0.05, 1.0)
        seeds = torch.randint(2**62, (B,), generator=g)
        to = lambda *xs: [x.to(device) for x in xs]  # noqa: E731  (a one-line local helper)
        name = f"B{B} k{k} V{V}"
        yield "greedy_accept", name, to(drafts, num, logits), True
        yield "rejection_sample", name, to(drafts, num, logits) + [None] + to(temp, top_k, top_p, seeds), False
        yield "rejection_sample", name + " q", to(drafts, num, logits, q, temp, top_k, top_p, seeds), False
        yield "process_logits", name, to(logits, temp, top_k, top_p), False
    tokens = torch.tensor([[0, 0, 1, 2, 3, 1], [0, 5, 0, 0, 0, 0]])
    parents = torch.tensor([[-1, 0, 0, 0, 3, 4], [-1, 0, 0, 0, 0, 0]])
    yield (
        "tree_accept",
        "greedy trees",
        to(tokens, parents, torch.tensor([6, 1]), torch.randn(2, 6, 8, generator=g))
        + [None]
        + to(torch.zeros(2), torch.zeros(2, dtype=torch.long), torch.ones(2), torch.arange(2)),
        True,
    )
    for B, N, V in ((16, 16, 32000), (8, 1 + 8, 8), (4, 6, 1)):  # serving size, full branching at V, V = 1
        parents = torch.stack(
            [torch.tensor([-1] + [int(torch.randint(i, (1,), generator=g)) for i in range(1, N)]) for _ in range(B)]
        )
        if V == 8:
            parents[:] = torch.tensor([-1] + [0] * V)
        logits = torch.randn(B, N, V, generator=g) * 3
        q = torch.softmax(torch.randn(B, N, V, generator=g) * 3, -1)
        tokens = torch.multinomial(q.view(B * N, V), 1, generator=g).view(B, N)
        tokens[:, 1] = logits[:, 0].argmax(-1)
        num_nodes = torch.randint(1, N + 1, (B,), generator=g)
        temp = torch.rand(B, generator=g) + 0.3
        temp[0] = 0.0
        top_k = torch.where(torch.rand(B, generator=g) < 0.5, torch.randint(1, 64, (B,), generator=g), 0)
        top_p = torch.where(torch.rand(B, generator=g) < 0.5, torch.rand(B, generator=g) * 0.9 + 0.05, 1.0)
        seeds = torch.randint(2**62, (B,), generator=g)
        name = f"B{B} N{N} V{V}"
        sampling = to(temp, top_k, top_p, seeds)
        yield "tree_accept", name, to(tokens, parents, num_nodes, logits) + [None] + sampling, False
        yield "tree_accept", name + " q", to(tokens, parents, num_nodes, logits, q, temp, top_k, top_p, seeds), False
    cache = torch.randn(4, 8, 8, 256, 64, generator=g)
    start = torch.randint(0, 256 - 16, (8,), generator=g)
    path = torch.stack(
        [
            torch.cat(
                [
                    torch.zeros(1, dtype=torch.long),
                    torch.randperm(15, generator=g)[:4].sort().values + 1,
                    torch.full((11,), -1),
                ]
            )
            for _ in range(8)
        ]
    )
    num = torch.randint(0, 5, (8,), generator=g)
    yield "compact_kv", "L4 B8 H8 S256 D64", to(cache, start, path, num), True
    yield "compact_kv_out", "L4 B8 H8 S256 D64", to(cache, start, path, num), True
    yield "confidence_truncate", "B8 k7", to(torch.rand(8, 7, generator=g), torch.full((8,), 7)) + [0.3], True


def _compacted(impl: Callable[..., object]) -> Callable[..., torch.Tensor]:
    """An in-place compact_kv as a function of a copy of the cache (so repeated timing runs see the same input)."""

    def run(cache, start, path, num_accepted):
        out = cache.clone()
        impl(out, start, path, num_accepted)
        return out

    return run


def run_checks(device: str = "cuda") -> list[CaseResult]:
    if not torch.cuda.is_available():
        raise NoCudaError(
            "plugins check needs a CUDA GPU: torch.cuda.is_available() is False "
            "(torch " + torch.__version__ + "); run it on a machine with an NVIDIA GPU and triton"
        )
    from plugins import reference
    from plugins.kernels import launch

    dev = torch.device(device)
    results = []
    kernels = {"compact_kv": _compacted(launch.compact_kv), "compact_kv_out": launch.compact_kv_out}
    references = {"compact_kv": _compacted(reference.compact_kv), "compact_kv_out": _compacted(reference.compact_kv)}
    for op, case, args, exact in _cases(dev):
        kernel, ref = kernels.get(op, getattr(launch, op, None)), references.get(op, getattr(reference, op, None))
        if kernel is None or ref is None:
            raise KeyError(f"check case '{case}' names op '{op}', which has no Triton kernel or CPU reference")
        got, kernel_ms = _time(kernel, args, dev)
        want, reference_ms = _time(ref, args, dev)
        ok, detail = True, "equal"
        for g_, w_ in zip(got, want):
            if g_.is_floating_point():
                err = float((g_ - w_).abs().max()) if g_.numel() else 0.0
                ok &= err < 1e-4
                detail = f"max abs err {err:.2e}"
            elif not exact:
                mismatch = float((g_ != w_).reshape(g_.shape[0], -1).any(dim=1).float().mean())
                ok &= mismatch <= 0.01
                detail = f"{mismatch:.1%} rows differ"
            else:
                ok &= bool(torch.equal(g_, w_))
        results.append(CaseResult(op, case, ok, detail, kernel_ms, reference_ms))
    return results
