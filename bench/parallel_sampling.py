"""What `n` sequences from one prompt cost: forked from one prefill against n separate requests of the same prompt.

    python -m bench.parallel_sampling                  # ~2 min on 2 cores; writes bench/results/parallel_sampling.json
    python -m bench.parallel_sampling --prompt-tokens 128 --max-tokens 8 --repeats 1   # a smoke run

Each run sends one long prompt (the repo's gsm8k eval questions as one chat turn, cut to `--prompt-tokens`) sampled at
temperature 0.8, with the default draft, in turn (interleaved, so the VM's drift hits every row alike):

    n=1                  one sequence: the baseline
    n=N forked           N sequences of one request: one prefill, its KV copied into N slots (engine forks)
    N separate requests  N requests with the same prompt, added together: N prefills in one padded batch

Reports the median time until every sequence has its first token (TTFT of the last choice: what `n` costs a
client before it sees all choices), the whole request's time, and the prompt tokens the target ran
(`SpecEngine.prompt_tokens_computed`). Target (issue 25): n = 4 costs one prefill, not four.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m bench.parallel_sampling",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--target", default="smollm2-135m", help="alias, GGUF file or HF dir (default: %(default)s)")
    p.add_argument("--draft", default="auto", help="drafter spec (default: %(default)s)")
    p.add_argument("--n", type=int, default=4, help="sequences per request (default: %(default)s)")
    p.add_argument("--prompt-tokens", type=int, default=512, help="prompt length (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=32, help="new tokens per sequence (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="timed passes (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--out", default=str(REPO_ROOT / "bench" / "results" / "parallel_sampling.json"))
    return p.parse_args(argv)


def long_prompt(target, num_tokens: int) -> list[int]:
    """A chat prompt of about `num_tokens` tokens: the repo's gsm8k eval questions as one user turn, cut to fit."""
    from deepspec.paths import eval_dataset

    lines = eval_dataset("gsm8k").read_text().splitlines()
    text = "\n\n".join(json.loads(line)["turns"][0] for line in lines[:40])
    ids = target.encode_chat([{"role": "user", "content": text}])
    return ids[-num_tokens:] if len(ids) > num_tokens else ids


def run_row(engine, prompt: list[int], params, n: int, forked: bool) -> dict:
    """Add one request of n sequences (forked) or n requests, step to the end; → the row's timings and counts."""
    computed = engine.prompt_tokens_computed
    ids = [f"s{i}" for i in range(n)]
    t0 = time.perf_counter()
    for i, rid in enumerate(ids):
        engine.add_request(
            rid,
            prompt,
            dataclasses.replace(params, seed=1000 + i),
            keep_result=True,
            fork_of=ids[0] if forked and i else None,
        )
    first: dict[str, float] = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.new_token_ids and out.request_id not in first:
                first[out.request_id] = time.perf_counter()
    end = time.perf_counter()
    tokens = sum(len(engine.pop_result(rid).token_ids) for rid in ids)
    return {
        "ttft_all": max(first.values()) - t0,
        "seconds": end - t0,
        "tokens": tokens,
        "prompt_tokens_computed": engine.prompt_tokens_computed - computed,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from bench.machine import cpu_flags, write_results
    from deepspec.decoding import SamplingParams, SpecEngine
    from deepspec.decoding.planner import BudgetPlanner
    from deepspec.decoding.registry import build_drafter
    from deepspec.models import load_target

    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_target(args.target)
    engine = SpecEngine(
        target,
        build_drafter(args.draft, target),
        max_batch_size=args.n,
        max_seq_len=args.prompt_tokens + args.max_tokens + 64,
        planner=BudgetPlanner(),
    )
    prompt = long_prompt(target, args.prompt_tokens)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.8, ignore_eos=True)
    rows = [("n=1", 1, False), (f"n={args.n} forked", args.n, True), (f"{args.n} separate requests", args.n, False)]
    run_row(engine, prompt[:32], params, 1, False)  # warm caches and allocator pools, untimed
    records = {name: [] for name, _, _ in rows}
    for _ in range(args.repeats):
        for name, n, forked in rows:
            records[name].append(run_row(engine, prompt, params, n, forked))
    table = {
        name: {
            "ttft_all_ms": statistics.median(r["ttft_all"] for r in rs) * 1000,
            "seconds": statistics.median(r["seconds"] for r in rs),
            "prompt_tokens_computed": statistics.median(r["prompt_tokens_computed"] for r in rs),
            "tokens": statistics.median(r["tokens"] for r in rs),
        }
        for name, rs in records.items()
    }
    print(
        f"target {args.target}, draft {args.draft}, prompt {len(prompt)} tokens, {args.max_tokens} new tokens per "
        f"sequence at T=0.8, {args.repeats} passes, torch threads {torch.get_num_threads()}"
    )
    print(f"CPU flags: {cpu_flags()}")
    base = table["n=1"]["ttft_all_ms"]
    print(
        f"{'row':24s} {'TTFT all ms':>12s} {'x n=1':>6s} {'request s':>10s} {'prompt tokens run':>18s} {'tokens':>7s}"
    )
    for name, row in table.items():
        print(
            f"{name:24s} {row['ttft_all_ms']:12.0f} {row['ttft_all_ms'] / base:5.2f}x {row['seconds']:10.2f} "
            f"{row['prompt_tokens_computed']:18.0f} {row['tokens']:7.0f}"
        )
    write_results(args.out, args, table=table, records=records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
