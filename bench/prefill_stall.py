"""Does a long prompt stall running streams? 8 streams decode on the default target while a 1,500-token prompt
arrives; each stream's inter-token latency (the time between the engine steps that gave it tokens) before, during and
after that prompt's prefill, with chunked prefill across steps (the engine's default) and with the whole prompt
prefilled in one step (what the engine did before); `--budgets` picks the chunk sizes compared.

    python -m bench.prefill_stall                  # ~3 min on 2 cores; writes bench/results/prefill_stall.json
    python -m bench.prefill_stall --long-tokens 600 --stream-tokens 48   # a shorter run

Target (issue 23): inter-token latency p99 <= 2x its p50 over the streams' tokens while the long prompt arrives.
Reports p50, p99 and their ratio per mode, the long prompt's time to first token, and the CPU flags.
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


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m bench.prefill_stall", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--draft", default="auto", help="drafter of the engine (default: %(default)s)")
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--stream-tokens", type=int, default=96, help="tokens each stream decodes (default: 96)")
    p.add_argument("--long-tokens", type=int, default=1500, help="the arriving prompt's length (default: 1500)")
    p.add_argument("--arrive-after", type=int, default=6, help="engine steps before the long prompt arrives")
    p.add_argument(
        "--budgets",
        default="default,128",
        help="comma list of prefill_tokens_per_step values to compare with the whole prefill "
        "(default: the engine's default and 128)",
    )
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=str(REPO_ROOT / "bench" / "results" / "prefill_stall.json"))
    return p.parse_args(argv)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(engine, args, long_prompt, prompts) -> dict:
    """One scenario: the streams start, the long prompt arrives after --arrive-after steps; → latencies."""
    from deepspec.decoding import SamplingParams

    stream = SamplingParams(max_tokens=args.stream_tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"s{i}", prompt, stream)
    last_token_at = {}
    gaps: list[float] = []  # per stream token event after its first: seconds since that stream's previous one
    step_index, arrived_at, ttft = 0, None, None
    while engine.has_unfinished() or arrived_at is None:  # the long prompt arrives even after short streams end
        if step_index == args.arrive_after:
            engine.add_request("long", long_prompt, SamplingParams(max_tokens=4, ignore_eos=True))
            arrived_at = time.perf_counter()
        outs = engine.step()
        now = time.perf_counter()
        step_index += 1
        for out in outs:
            if not out.new_token_ids:
                continue
            if out.request_id == "long":
                assert arrived_at is not None  # its outputs come after it was added
                ttft = ttft if ttft is not None else now - arrived_at
                continue
            if out.request_id in last_token_at:
                gaps.append(now - last_token_at[out.request_id])
            last_token_at[out.request_id] = now
    p50, p99 = statistics.median(gaps), percentile(gaps, 0.99)
    return {
        "itl_p50_ms": p50 * 1000,
        "itl_p99_ms": p99 * 1000,
        "p99_over_p50": p99 / p50,
        "itl_max_ms": max(gaps) * 1000,
        "long_ttft_s": ttft,
        "token_events": len(gaps),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from bench.machine import cpu_flags
    from deepspec.decoding import SamplingParams, SpecEngine
    from deepspec.decoding.planner import BudgetPlanner
    from deepspec.decoding.registry import build_drafter
    from deepspec.models import load_target

    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_target(args.target)
    texts = [
        "Write a Python function that reverses a list.",
        "What is 17 times 23?",
        "Name three rivers in Europe.",
        "Explain recursion in one sentence.",
        "Write a haiku about the sea.",
        "List the planets in order.",
        "What does HTTP stand for?",
        "Give a synonym for quick.",
    ]
    prompts = [target.encode_chat([{"role": "user", "content": texts[i % len(texts)]}]) for i in range(args.streams)]
    filler = target.encode_chat(
        [
            {
                "role": "user",
                "content": "Summarize this text: "
                + " ".join(f"Sentence {i} says that the weather was mild and the market was busy." for i in range(400)),
            }
        ]
    )
    long_prompt = filler[: args.long_tokens]
    results = {}
    modes = [(f"chunks of {b}", None if b == "default" else int(b)) for b in args.budgets.split(",") if b]
    for mode, budget in (*modes, ("whole prompt in one step", 10**9)):
        engine = SpecEngine(
            target,
            build_drafter(args.draft, target),
            max_batch_size=args.streams + 1,
            max_seq_len=2048,
            prefill_tokens_per_step=budget,
            planner=BudgetPlanner(),
        )
        engine.generate([prompts[0]], SamplingParams(max_tokens=8))  # warm, untimed
        results[mode] = run(engine, args, long_prompt, prompts)
        results[mode]["prefill_tokens_per_step"] = engine.prefill_tokens_per_step if budget != 10**9 else "all"
    print(
        f"target {args.target}, draft {args.draft}, {args.streams} streams x {args.stream_tokens} tokens, a "
        f"{len(long_prompt)}-token prompt arrives after {args.arrive_after} steps; torch threads "
        f"{torch.get_num_threads()}; CPU flags: {cpu_flags()}"
    )
    header = ("mode (prompt tokens/step)", "ITL p50 ms", "p99 ms", "p99/p50", "max ms", "long TTFT s")
    print(f"{header[0]:26s} {header[1]:>10s} {header[2]:>8s} {header[3]:>8s} {header[4]:>8s} {header[5]:>11s}")
    for mode, r in results.items():
        print(
            f"{mode:26s} {r['itl_p50_ms']:10.1f} {r['itl_p99_ms']:8.1f} {r['p99_over_p50']:8.2f} "
            f"{r['itl_max_ms']:8.1f} {r['long_ttft_s']:11.2f}"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "cpu_flags": cpu_flags(), "results": results}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
