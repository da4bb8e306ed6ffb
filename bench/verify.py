"""One verification step on CPU, today's path (sort-based filter + a Python loop per row) against the plugins ops.

    python -m bench.verify                 # ~1 min; prints a table, writes bench/results/verify.json
    python -m bench.verify --reps 50       # steadier medians

Setup: batch 8, k = 7 drafts per row, V = 49,152 (SmolLM2's vocabulary), random target logits (torch.randn) and
random drafts, so most rows reject early, as a weak draft does. Each mode times the whole step, from the
[B, k+1, V] logits to the accepted counts and next tokens:

  greedy            old: argmax + greedy_verify         new: deepspec::greedy_accept
  temperature 1     old: softmax + rejection_verify_row  new: deepspec::rejection_sample
  temp 1 + top-p .9 old: sort-based top-p + the loop     new: deepspec::rejection_sample (threshold search, no sort)

The old path is a copy of the code the engine ran before the ops (below), so the comparison stays reproducible.
Old and new alternate rep by rep and the table shows medians, so a burst of load hits both alike. Goals: greedy no
slower, temperature 1 <= 8 ms, top-p <= 25 ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch

import plugins

RESULTS = REPO_ROOT / "bench" / "results"


# ---- the path before the plugins ops (deepspec/decoding/{sampling,verify}.py and engine.py, November) ---------
def old_sampling_probs(logits, temperature, top_k, top_p):
    temp = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    scaled = logits / temp[:, None, None]
    if bool((top_k > 0).any()) or bool((top_p < 1).any()):
        V = scaled.shape[-1]
        sorted_logits, order = scaled.sort(dim=-1, descending=True)
        rank = torch.arange(V)
        k = torch.where(top_k > 0, top_k, torch.full_like(top_k, V))
        remove = rank[None, None, :] >= k[:, None, None]
        probs = torch.softmax(sorted_logits.masked_fill(remove, float("-inf")), dim=-1)
        remove = remove | ((probs.cumsum(dim=-1) - probs) >= top_p[:, None, None])
        sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
        scaled = torch.empty_like(scaled).scatter_(-1, order, sorted_logits)
    return torch.softmax(scaled, dim=-1)


def old_greedy_verify(draft_tokens, num_draft_tokens, target_argmax):
    k = draft_tokens.shape[1]
    in_range = torch.arange(k)[None, :] < num_draft_tokens[:, None]
    match = (draft_tokens == target_argmax[:, :k]) & in_range
    return match.long().cumprod(dim=1).sum(dim=1)


def old_rejection_verify_row(draft_tokens, target_probs, draft_probs, generator):
    n = len(draft_tokens)
    uniforms = torch.rand(n, generator=generator).tolist() if n else []
    for j, token in enumerate(draft_tokens):
        p = float(target_probs[j, token])
        q = 1.0 if draft_probs is None else float(draft_probs[j, token])
        if q > 0 and uniforms[j] < min(1.0, p / q):
            continue
        residual = target_probs[j].clone()
        residual[token] = 0.0
        total = float(residual.sum())
        if total <= 0.0:
            residual, total = target_probs[j], 1.0
        return j, int(torch.multinomial(residual / total, 1, generator=generator))
    return n, int(torch.multinomial(target_probs[n], 1, generator=generator))


def old_step(drafts, num, logits, temperature, top_k, top_p, generators):
    if bool((temperature == 0).all()):
        argmax = logits.argmax(dim=-1)
        n_acc = old_greedy_verify(drafts, num, argmax).tolist()
        rows = argmax.tolist()
        return n_acc, [rows[i][n] for i, n in enumerate(n_acc)]
    probs = old_sampling_probs(logits.float(), temperature, top_k, top_p)
    out = [
        old_rejection_verify_row(drafts[i, : int(num[i])].tolist(), probs[i, : int(num[i]) + 1], None, g)
        for i, g in enumerate(generators)
    ]
    return [a for a, _ in out], [t for _, t in out]


def new_step(drafts, num, logits, temperature, top_k, top_p, seeds):
    if bool((temperature == 0).all()):
        n_acc, nxt = plugins.greedy_accept(drafts, num, logits)
    else:
        n_acc, nxt = plugins.rejection_sample(drafts, num, logits, None, temperature, top_k, top_p, seeds)
    return n_acc.tolist(), nxt.tolist()


MODES = {"greedy": (0.0, 1.0), "temperature 1": (1.0, 1.0), "temperature 1 + top-p 0.9": (1.0, 0.9)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--batch", type=int, default=8, help="rows (default 8)")
    parser.add_argument("--k", type=int, default=7, help="draft slots per row (default 7)")
    parser.add_argument("--vocab", type=int, default=49152, help="vocabulary size (default 49,152)")
    parser.add_argument("--reps", type=int, default=20, help="timed steps per path and mode (default 20)")
    args = parser.parse_args(argv)
    B, k, V = args.batch, args.k, args.vocab

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(B, k + 1, V, generator=g)
    drafts = torch.randint(V, (B, k), generator=g)
    num = torch.full((B,), k, dtype=torch.long)
    rows = []
    for mode, (temp, p) in MODES.items():
        temperature = torch.full((B,), temp)
        top_k = torch.zeros(B, dtype=torch.long)
        top_p = torch.full((B,), p)
        generators = [torch.Generator().manual_seed(i) for i in range(B)]
        times = {"old": [], "new": []}
        for rep in range(args.reps + 2):  # two warm-up reps
            seeds = torch.randint(2**62, (B,), generator=g)
            for path in ("old", "new") if rep % 2 else ("new", "old"):
                t0 = time.perf_counter()
                if path == "old":
                    old_step(drafts, num, logits, temperature, top_k, top_p, generators)
                else:
                    new_step(drafts, num, logits, temperature, top_k, top_p, seeds)
                if rep >= 2:
                    times[path].append((time.perf_counter() - t0) * 1e3)
        old_ms, new_ms = statistics.median(times["old"]), statistics.median(times["new"])
        rows.append(
            {"mode": mode, "old_ms": round(old_ms, 2), "new_ms": round(new_ms, 2), "speedup": round(old_ms / new_ms, 2)}
        )

    print(f"one verify step, B={B} k={k} V={V}, CPU, {torch.get_num_threads()} threads, median of {args.reps}")
    print(f"{'mode':<28} {'old ms':>9} {'new ms':>9} {'speedup':>8}")
    for r in rows:
        print(f"{r['mode']:<28} {r['old_ms']:>9.2f} {r['new_ms']:>9.2f} {r['speedup']:>7.2f}x")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "verify.json").write_text(
        json.dumps(
            {"batch": B, "k": k, "vocab": V, "threads": torch.get_num_threads(), "reps": args.reps, "rows": rows},
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
