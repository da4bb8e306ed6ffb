"""How many tokens each draft wins per target forward on text nobody trained for: counts, not timings.

    python -m bench.draft_acceptance                                   # chat + the held-out synthetic split
    python -m bench.draft_acceptance --drafts auto,prompt-lookup,drafts/smollm2-135m-eagle3 --sets chat,humaneval
    python -m bench.draft_acceptance --drafts drafts/smollm2-135m-corpus,/tmp/corpus-new   # a rebuilt index

Each set's prompts (a datasets/eval name, or a `{"turns": [...]}` JSONL file such as the held-out synthetic split
`training/data/synth/prompts.heldout.jsonl`, which no draft trains on) are decoded greedily at batch 1 on the served
target (the native decoder) with every draft verified in full, `--depth` tokens a round (vLLM's fixed
num_speculative_tokens). Reported per draft and set: tokens per target forward over all rounds (what speculation
can buy at most, before the verification budget keeps only the depths that pay on this machine), τ over the rounds
that drafted, the share of rounds that drafted, the acceptance rate and number of accepted draft tokens. Outputs
are checked token for token against target-only decoding. `--fp32` decodes on the PyTorch target in float32 (what
the drafts were trained against) instead: how drafts/README.md compares one draft's storage forms (int8, q4).

Counts do not depend on what else the machine runs, so this runs beside other work; the speed that a count buys is
`bench.service_throughput`'s to measure, on a quiet machine. Between the two, `--modelled`: each draft is decoded
again with the served verification budget on this machine's kept step curve (the budget's cache file, written by a
served worker; no learning online), and every verify pass is priced by that curve, so the table gains what the
budget's depths would buy here at batch 1 if the curve holds (drafting's own time left out), against target-only
priced alike.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import cast

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from training.data import jsonl_stem, read_jsonl_lines
from training.draft_specs import parse_draft_spec

HELDOUT_SYNTH = REPO_ROOT / "training" / "data" / "synth" / "prompts.heldout.jsonl.gz"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.draft_acceptance",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--target", default="smollm2-135m", help="alias, GGUF file or HF dir (default: %(default)s)")
    p.add_argument("--drafts", default="auto", help="comma list of drafter specs (default: %(default)s)")
    p.add_argument(
        "--sets",
        default=f"chat,{HELDOUT_SYNTH.relative_to(REPO_ROOT)}",
        help="comma list of datasets/eval names or {turns} JSONL files (default: %(default)s)",
    )
    p.add_argument("--num-prompts", type=int, default=12, help="first N prompts of each set (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=128, help="new tokens per prompt (default: %(default)s)")
    p.add_argument("--depth", type=int, default=7, help="draft tokens verified a round (default: %(default)s)")
    p.add_argument(
        "--fp32",
        action="store_true",
        help="decode on the PyTorch target in float32 instead of the served native decoder: the reference the "
        "drafts were trained against (drafts/README.md's fixed-depth comparisons of one draft's storage forms)",
    )
    p.add_argument(
        "--one-session",
        action="store_true",
        help="send each set's prompts as one session (deepspec/decoding/session_memory.py): later answers "
        "draft from the earlier ones, as a server remembering one client's traffic would",
    )
    p.add_argument(
        "--modelled",
        action="store_true",
        help="add the budget's modelled speedup on this machine's kept step curve (module docstring)",
    )
    p.add_argument(
        "--curve",
        type=Path,
        default=None,
        help="--modelled on this step-curve file (the budget's cache format, ~/.cache/deepspec/step_curves)"
        " instead of this machine's kept one",
    )
    p.add_argument("--out", default=str(REPO_ROOT / "bench" / "results" / "draft_acceptance.json"))
    return p.parse_args(argv)


def set_turns(spec: str, n: int) -> list[str]:
    """The first user turns of the first `n` prompts of a set: an eval name or a JSONL file."""
    from deepspec.paths import eval_dataset

    path = Path(spec) if spec.endswith((".jsonl", ".jsonl.gz")) else eval_dataset(spec)
    if not path.is_file():
        raise SystemExit(
            f"no prompt set {spec!r} (looked for {path}); the synthetic split is made by "
            f"`python -m training synth` (training/data/README.md)"
        )
    return [json.loads(line)["turns"][0] for line in read_jsonl_lines(path)[:n]]


def _drafter(spec: str, target):
    """A drafter from a spec with options after a colon (`drafts/smollm2-135m-corpus:tree=true`)."""
    return parse_draft_spec(spec).build(target)


def count_row(
    target,
    drafter,
    prompts: list[list[int]],
    max_tokens: int,
    depth: int,
    reference: list[list[int]] | None,
    session: str | None = None,
) -> tuple[dict, list[list[int]]]:
    """Decode `prompts` one at a time with `drafter` (None: target-only) verifying every draft; the counts, and the
    outputs (checked against `reference` where given)."""
    from deepspec.decoding import SamplingParams, SpecEngine

    engine = SpecEngine(target, drafter, max_batch_size=1, max_seq_len=2048, num_speculative_tokens=depth)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, session=session)
    rounds = drafted = draft_tokens = accepted = 0
    outputs = []
    for prompt in prompts:
        result = engine.generate([prompt], params)[0]
        outputs.append(result.token_ids)
        rounds += result.num_steps
        drafted += result.num_drafted_steps
        draft_tokens += result.num_draft_tokens
        accepted += result.num_accepted_tokens
    if reference is not None:
        same = sum(a == b for a, b in zip(outputs, reference))
        if same != len(reference):
            raise SystemExit(
                f"{drafter.name}: {len(reference) - same} of {len(reference)} outputs differ from target-only decoding"
            )
    return {
        "rounds": rounds,
        "accepted": accepted,
        "tokens_per_forward": round((accepted + rounds) / max(rounds, 1), 3),
        "tau": round((accepted + drafted) / drafted, 3) if drafted else None,
        "drafted_share": round(drafted / max(rounds, 1), 3),
        "acceptance_rate": round(accepted / draft_tokens, 3) if draft_tokens else None,
    }, outputs


class PricedTarget:
    """The target with every verify pass priced by a step curve: `seconds` adds up what the passes would take."""

    def __init__(self, target, curve):
        self.target, self.curve, self.seconds = target, curve, 0.0

    def __getattr__(self, name):
        return getattr(self.target, name)

    def forward(self, tokens, start, cache=None, **kw):
        if cache is not None and tokens.shape[1] <= 16:  # decode rounds (and a prompt this short, alike in every row)
            self.seconds += (
                self.curve.at_context(int(start.sum())).round_seconds(tokens.shape[0], [tokens.shape[1] - 1]).item()
            )
        return self.target.forward(tokens, start, cache, **kw)


def modelled_speedup(
    target, curve, drafter, prompts: list[list[int]], max_tokens: int, depth: int, baseline_seconds: float | None = None
) -> tuple[float, float]:
    """(seconds the curve prices a decode of `prompts` at, speedup over `baseline_seconds`): with `drafter`
    under the served BudgetPlanner on `curve` (None: target-only)."""
    from deepspec.decoding import SamplingParams, SpecEngine
    from deepspec.decoding.planner import BudgetPlanner
    from deepspec.models import Target

    priced = PricedTarget(target, curve)
    engine = SpecEngine(
        cast(Target, priced),  # a proxy: every member but forward is the wrapped target's (__getattr__)
        drafter,
        max_batch_size=1,
        max_seq_len=2048,
        num_speculative_tokens=depth,
        planner=BudgetPlanner(curve, learn_online=False),
    )
    for prompt in prompts:
        engine.generate([prompt], SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return priced.seconds, (baseline_seconds / priced.seconds if baseline_seconds else 1.0)


def kept_curve(target, path: Path | None = None):
    """This machine's step curve for the served target, as the budget's cache file keeps it (or the file at
    `path`, whatever machine it names); exits if none."""
    from deepspec.decoding.step_timing import StepCurveCache

    cache = StepCurveCache.for_target(target, ())
    if path is not None:
        cache = StepCurveCache(path, json.loads(path.read_text()).get("identity"))
    curve = cache.load(target.multi_token_rows_serial)
    if curve is None:
        raise SystemExit(
            f"--modelled: no kept step curve for this target and machine ({cache.path}); serve it "
            "once (`make serve`, a few requests) so the budget writes one"
        )
    return curve


def main(argv=None) -> int:
    args = parse_args(argv)
    from bench.machine import cpu_flags, write_results
    from deepspec.models import load_target
    from deepspec.models.native import load_native_target

    target = load_target(args.target) if args.fp32 else load_native_target(args.target)
    backend = "float32" if args.fp32 else f"native {getattr(target, 'quantization', '')}"
    curve = kept_curve(target, args.curve) if args.modelled else None
    rows: dict[str, dict[str, dict]] = {}
    for spec in args.sets.split(","):
        prompts = [target.encode_chat([{"role": "user", "content": t}]) for t in set_turns(spec, args.num_prompts)]
        _, reference = count_row(target, None, prompts, args.max_tokens, args.depth, None)
        name = jsonl_stem(spec) if spec.endswith((".jsonl", ".jsonl.gz")) else spec
        base = modelled_speedup(target, curve, None, prompts, args.max_tokens, args.depth)[0] if curve else None
        for draft in args.drafts.split(","):
            rows.setdefault(draft, {})[name], _ = count_row(
                target,
                _drafter(draft, target),
                prompts,
                args.max_tokens,
                args.depth,
                reference,
                name if args.one_session else None,
            )
            if curve is not None:
                rows[draft][name]["modelled_speedup"] = round(
                    modelled_speedup(
                        target, curve, _drafter(draft, target), prompts, args.max_tokens, args.depth, base
                    )[1],
                    3,
                )
            print(f"{draft} on {name}: {rows[draft][name]}", file=sys.stderr)
    sets = list(next(iter(rows.values())))
    print(
        f"target {args.target} ({backend}), greedy, batch 1, every draft verified "
        f"({args.depth} a round), {args.num_prompts} prompts x {args.max_tokens} tokens per set; CPU flags: "
        f"{cpu_flags()}"
    )
    modelled = ", modelled speedup" if curve is not None else ""
    if curve is not None:
        print(f"modelled on this machine's kept step curve: {curve}")
    print("| draft | " + " | ".join(f"{s}: tokens/forward, τ, drafted{modelled}" for s in sets) + " |")
    print("| --- |" + " --- |" * len(sets))
    for draft, by_set in rows.items():
        cells = [
            f"{r['tokens_per_forward']:.2f}, {r['tau'] or 0:.2f}, {r['drafted_share']:.0%}"
            + (f", {r['modelled_speedup']:.2f}x" if "modelled_speedup" in r else "")
            for r in by_set.values()
        ]
        print(f"| {draft} | " + " | ".join(cells) + " |")
    write_results(args.out, args, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
