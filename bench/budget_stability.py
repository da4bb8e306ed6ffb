"""Does the verification budget decide the same way on every start? Several starts of the served engine (native
decoder, default draft, BudgetPlanner) decode the same prompts greedily at batch 1; one start in two runs its step
probe while CPU burners run beside it (a neighbour process starting on the same machine). Each start gets a fresh
probe (the per-process probe memo is cleared; no cache file), and two planners are compared:

- `probe only`: the curve the probe measured decides for the engine's whole life (learn_online=False);
- `served passes`: the same probe, corrected by every verify pass served (deepspec/decoding/step_timing.py).

The rule (issue: a budget that decides the same way on every start): within a planner, the starts' draft counts
differ by at most 10%. Per start the table gives the probed t(1) and t(8) (with `--batch` B > 1: the B-row passes of
one and two tokens a row, t(B rows, B) and t(B rows, 2B), StepTimeModel.pass_seconds), draft tokens, tokens per target
forward over every round, and tok/s.

    python -m bench.budget_stability                       # 4 starts, 8 prompts x 96 tokens
    python -m bench.budget_stability --batch 8 --num-prompts 16    # the prompts 8 at a time
    python -m bench.budget_stability --prompts training/data/synth/prompts.heldout.jsonl.gz
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path

from training.data import read_jsonl_lines

REPO_ROOT = Path(__file__).resolve().parent.parent
HELD_OUT_CHAT = REPO_ROOT / "training" / "data" / "synth" / "prompts.heldout.jsonl.gz"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.budget_stability",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--target", default="smollm2-135m", help="alias, GGUF file or HF dir (default: %(default)s)")
    p.add_argument("--draft", default="auto", help="drafter spec (default: %(default)s, the served default)")
    p.add_argument(
        "--prompts",
        default=None,
        help="JSON lines with {'turns': [...]}: default the held-out synthetic chat split where it has been "
        "built (training/data/synth), else datasets/eval/mbpp.jsonl",
    )
    p.add_argument("--num-prompts", type=int, default=8, help="prompts per start (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=96, help="new tokens per prompt (default: %(default)s)")
    p.add_argument("--starts", type=int, default=4, help="starts per planner, every other one disturbed")
    p.add_argument("--burners", type=int, default=2, help="busy processes beside a disturbed probe")
    p.add_argument("--batch", type=int, default=1, help="rows decoding together (default: %(default)s)")
    p.add_argument("--out", default=str(REPO_ROOT / "bench" / "results" / "budget_stability.json"))
    return p.parse_args(argv)


def _burn() -> None:
    while True:
        pass


def load_chat_prompts(target, path: Path, count: int) -> list[list[int]]:
    rows = [json.loads(line) for line in read_jsonl_lines(path) if line.strip()][:count]
    return [target.encode_chat([{"role": "user", "content": row["turns"][0]}]) for row in rows]


def one_start(target, draft: str, prompts, max_tokens: int, learn_online: bool, burners: int, batch: int = 1) -> dict:
    """Build the engine (its probe beside `burners` busy processes) and decode the prompts `batch` at a time."""
    from deepspec.decoding import SamplingParams, SpecEngine, build_drafter, step_timing
    from deepspec.decoding.planner import BudgetPlanner

    step_timing._PROBED.clear()  # a fresh probe, as a new worker process would take
    procs = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(burners)]
    for proc in procs:
        proc.start()
    time.sleep(0.2 if procs else 0)
    try:
        engine = SpecEngine(
            target,
            build_drafter(draft, target),
            max_batch_size=batch,
            max_seq_len=2048,
            planner=BudgetPlanner(learn_online=learn_online),
        )
    finally:
        for proc in procs:
            proc.terminate()
            proc.join()
    probe = engine.planner.step_time
    if probe is None:
        raise RuntimeError("the budget planner took no step curve: nothing to measure the stability of")
    engine.generate([prompts[0]], SamplingParams(max_tokens=8))  # warm, untimed, not the budget's prior
    engine.forget_acceptance()
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    results = engine.generate(prompts, params) if batch > 1 else [engine.generate([p], params)[0] for p in prompts]
    seconds = time.perf_counter() - start
    tokens = sum(len(r.token_ids) for r in results)
    rounds = sum(r.num_steps for r in results)
    final = engine.planner.step_time
    if final is None:
        raise RuntimeError("the budget planner dropped its step curve while decoding")
    return {
        # predict takes a count here, so it answers a float (a tensor only for a tensor of counts)
        "probe_ms": _points(probe, batch),
        "final_ms": _points(final, batch),
        "draft_tokens": sum(r.num_draft_tokens for r in results),
        "tokens_per_forward": round((sum(r.num_accepted_tokens for r in results) + rounds) / max(rounds, 1), 3),
        "tok_s": round(tokens / seconds, 1),
        "disturbed": bool(burners),
    }


def _points(curve, batch: int) -> list[float]:
    """The two step times a start reports, in ms: t(1) and t(8) at batch 1, else B-row passes of 1 and 2 tokens
    a row."""
    passes = ((1, 1), (1, 8)) if batch == 1 else ((batch, batch), (batch, 2 * batch))
    return [round(curve.pass_seconds(rows, n) * 1e3, 2) for rows, n in passes]


def main(argv=None) -> int:
    args = parse_args(argv)
    from bench.machine import cpu_flags, write_results
    from deepspec.models.native import load_native_target

    path = (
        Path(args.prompts)
        if args.prompts
        else (HELD_OUT_CHAT if HELD_OUT_CHAT.is_file() else REPO_ROOT / "datasets" / "eval" / "mbpp.jsonl")
    )
    target = load_native_target(args.target)
    prompts = load_chat_prompts(target, path, args.num_prompts)
    rows = {}
    for name, online in (("probe only", False), ("served passes", True)):
        rows[name] = [
            one_start(target, args.draft, prompts, args.max_tokens, online, args.burners * (i % 2), args.batch)
            for i in range(args.starts)
        ]
        for i, r in enumerate(rows[name]):
            print(f"{name} start {i}: {r}", file=sys.stderr)
    print(
        f"target {args.target} (native {target.quantization}), draft {args.draft}, prompts {path.name} "
        f"({len(prompts)} x {args.max_tokens} tokens, batch {args.batch}, greedy); CPU flags: {cpu_flags()}"
    )
    sizes = "t(1) / t(8)" if args.batch == 1 else f"t({args.batch} rows: {args.batch} / {2 * args.batch} tokens)"
    print(f"| planner | start | probe {sizes} ms | after serving | draft tokens | tokens per forward | tok/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    summary = {}
    for name, starts in rows.items():
        for i, r in enumerate(starts):
            label = f"{i}{' (disturbed)' if r['disturbed'] else ''}"
            print(
                f"| {name} | {label} | {r['probe_ms'][0]} / {r['probe_ms'][1]} | {r['final_ms'][0]} / "
                f"{r['final_ms'][1]} | {r['draft_tokens']} | {r['tokens_per_forward']} | {r['tok_s']} |"
            )
        drafts = [r["draft_tokens"] for r in starts]
        spread = (max(drafts) - min(drafts)) / max(max(drafts), 1)
        summary[name] = {"draft_spread": round(spread, 3), "within_10_percent": spread <= 0.10}
    for name, s in summary.items():
        print(
            f"{name}: starts' draft counts differ by {s['draft_spread']:.0%} "
            f"({'within' if s['within_10_percent'] else 'outside'} the 10% rule)"
        )
    write_results(args.out, args, rows=rows, summary=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
