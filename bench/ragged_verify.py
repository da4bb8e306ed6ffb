"""Per-row verify depths against a padded batch: what ragged verify passes buy at concurrency 8.

    python -m bench.ragged_verify                    # chat + lbpp, 16 prompts x 96 tokens each, 3 rounds, ~10 min
    python -m bench.ragged_verify --sets chat --rounds 1 --num-prompts 8

The served engine (native decoder, `--draft auto`, the verification budget with this machine's kept step curve, which
prices a pass by its rows and tokens: deepspec/decoding/DESIGN.md, "The budget's step model") decodes the same prompts
greedily, `--batch` rows at a time, once per engine per round, the engines' order alternating between rounds:

  ragged   the native decoder's ragged passes (Target.ragged_rows): each row verifies its own depth, chosen by
           ranking draft slots across the batch (verify_budget.best_row_depths; BudgetPlanner.per_row_depths);
  uniform  ragged passes with one depth for the batch, each row cut to its own draft count
           (BudgetPlanner(per_row_depths=False));
  padded   the same target told it has no ragged rows: one depth for the whole batch (verify_budget.best_depth),
           every row padded to it;
  onerow   `ragged` priced as before the step model by rows: the probe's one-row curve at the pass's total tokens,
           frozen (what over-drafted at 8 rows; the count of draft tokens is the comparison, not its tok/s alone);
  none     target-only (`--draft none`), the baseline the others divide by.

Reported per set and engine: tok/s (median over rounds), tokens per target forward, verify tokens per row and pass,
draft tokens verified (the last round's), and whether every output is the target-only one. Outputs must be identical
everywhere; only speed may differ. Timings on a shared machine are noisy: the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.draft_acceptance import set_turns
from bench.machine import cpu_flags, write_results

ENGINES = ("ragged", "uniform", "padded", "onerow", "none")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.ragged_verify", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--target", default="smollm2-135m", help="alias, GGUF file or HF dir (default: %(default)s)")
    p.add_argument("--draft", default="auto", help="drafter spec (default: %(default)s)")
    p.add_argument(
        "--sets", default="chat,lbpp", help="comma list of eval names or {turns} files (default: %(default)s)"
    )
    p.add_argument("--num-prompts", type=int, default=16, help="prompts per set (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=96, help="new tokens per prompt (default: %(default)s)")
    p.add_argument("--batch", type=int, default=8, help="rows decoding together (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per engine (default: %(default)s)")
    p.add_argument("--out", default=str(REPO_ROOT / "bench" / "results" / "ragged_verify.json"))
    return p.parse_args(argv)


def build_engines(args) -> dict:
    """The engines, each on its own target instance (the padded one's says it has no ragged rows)."""
    from deepspec.decoding import SpecEngine, build_drafter
    from deepspec.decoding.planner import BudgetPlanner
    from deepspec.models.native import load_native_target

    engines = {}
    for name in ENGINES:
        target = load_native_target(args.target)
        if name == "padded":
            target.ragged_rows = False  # type: ignore[misc]  # this instance pads, as a target without them would
        drafter = build_drafter(args.draft, target) if name != "none" else None
        planner = BudgetPlanner.kept_per_machine(target, drafter) if drafter is not None else None
        if planner is not None:
            planner.per_row_depths = name in ("ragged", "onerow")  # the ranked depths under test (opt-in)
        engines[name] = SpecEngine(target, drafter, max_batch_size=args.batch, max_seq_len=2048, planner=planner)
        if name == "onerow" and planner is not None and planner.step_time is not None:
            planner.step_time = _one_row(planner.step_time)
    return engines


def _one_row(curve):
    """`curve` without its multi-row curves: every pass priced by its total tokens on the one-row curve."""
    from deepspec.decoding.verify_budget import StepTimeModel

    points = list(zip(curve.sizes.tolist(), curve.times.tolist()))
    return StepTimeModel(points, curve.rows_serial, curve.per_key_query)


def decode(engine, prompts, max_tokens: int) -> tuple[list[list[int]], dict]:
    """Every prompt through the engine at its batch size → (outputs, tok/s and pass counts)."""
    from deepspec.decoding import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    results = engine.generate(prompts, params)
    seconds = time.perf_counter() - start
    tokens = sum(len(r.token_ids) for r in results)
    rounds = sum(r.num_steps for r in results)
    accepted = sum(r.num_accepted_tokens for r in results)
    drafts = sum(r.num_draft_tokens for r in results)
    return [r.token_ids for r in results], {
        "tok_s": tokens / seconds,
        "tokens_per_forward": (accepted + rounds) / max(rounds, 1),
        "verify_tokens_per_row_pass": (drafts + rounds) / max(rounds, 1),
        "draft_tokens": drafts,
    }


def main(argv=None) -> int:
    from deepspec.decoding import SamplingParams

    args = parse_args(argv)
    engines = build_engines(args)
    warm = engines["none"].target.encode_chat([{"role": "user", "content": "Hi"}])
    for engine in engines.values():  # first calls' allocations out of the timing, the warm-up out of the prior
        engine.generate([warm], SamplingParams(max_tokens=8))
        engine.forget_acceptance()
    table: dict[str, dict[str, dict]] = {}
    for spec in args.sets.split(","):
        target = engines["none"].target
        prompts = [target.encode_chat([{"role": "user", "content": t}]) for t in set_turns(spec, args.num_prompts)]
        runs: dict[str, list[dict]] = {name: [] for name in ENGINES}
        outputs: dict[str, list[list[int]]] = {}
        for r in range(args.rounds):
            for name in ENGINES if r % 2 == 0 else ENGINES[::-1]:
                outputs[name], stats = decode(engines[name], prompts, args.max_tokens)
                runs[name].append(stats)
        base = statistics.median(s["tok_s"] for s in runs["none"])
        table[spec] = {
            name: {
                "tok_s": round(statistics.median(s["tok_s"] for s in runs[name]), 1),
                "vs_none": round(statistics.median(s["tok_s"] for s in runs[name]) / base, 3),
                "tokens_per_forward": round(runs[name][-1]["tokens_per_forward"], 3),
                "verify_tokens_per_row_pass": round(runs[name][-1]["verify_tokens_per_row_pass"], 3),
                "draft_tokens": runs[name][-1]["draft_tokens"],
                "identical": outputs[name] == outputs["none"],
            }
            for name in ENGINES
        }
    print(
        f"CPU flags: {cpu_flags()}; batch {args.batch}, {args.num_prompts} prompts x {args.max_tokens} tokens; "
        f"load average {' / '.join(f'{x:.1f}' for x in os.getloadavg())} (1 / 5 / 15 min)"
    )
    print("| set | engine | tok/s | vs none | tokens/forward | verify tokens/row/pass | draft tokens | identical |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for spec, rows in table.items():
        for name, row in rows.items():
            print(
                f"| {spec} | {name} | {row['tok_s']} | {row['vs_none']}x | {row['tokens_per_forward']} | "
                f"{row['verify_tokens_per_row_pass']} | {row['draft_tokens']} | {row['identical']} |"
            )
    curves = {name: repr(e.planner.step_time) for name, e in engines.items() if e.planner.step_time is not None}
    for name, curve in curves.items():
        print(f"{name}: {curve}")
    write_results(args.out, args, results=table, step_curves=curves)
    return 0 if all(row["identical"] for rows in table.values() for row in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
