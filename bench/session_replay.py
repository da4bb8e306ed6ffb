"""An agent-style replay: one session whose requests repeat edited versions of earlier ones, with and without
session memory (deepspec/decoding/session_memory.py).

Each conversation starts from a coding task; every later turn sends the same task again after a tool result, as an
agent loop re-issues a step (`--kind retry`, the default: the target's answer then shares much with the one it wrote
before), or with one more change request (`--kind rewrite`: the target rewrites its code, often differently), or the
same request unchanged (`--kind repeat`: a step re-sent whose answer the client lost; greedy, the target writes its
answer again, the case where memory drafts the most). Rows,
at batch 1 and greedy on the native decoder with the served planner (BudgetPlanner):

- `--draft none`: the target alone;
- the default draft, requests without a session (nothing is remembered);
- the default draft, every request of a conversation in one session (its earlier answers draft the next ones).

The first turn of each conversation is decoded but not timed (nothing is remembered yet in any row); the table gives
tok/s over the later turns, tokens per target forward, and the ratio to `--draft none`. The issue's rule: session
memory on >= 3x `--draft none`. Outputs are checked token for token against the target alone.

    python -m bench.session_replay                              # 4 conversations x 4 turns x 128 tokens
    python -m bench.session_replay --num-speculative-tokens 15  # deeper rounds: long repeats pay at depth
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
#: `--turns rewrite`: each later turn appends one more change request (the target then rewrites its code, often
#: differently: the answers share little)
EDITS = (
    "Name the function `solve`.",
    "Use 4-space indentation and add a docstring.",
    "Keep the same code, and add one example call at the end.",
    "Name the function `answer` instead.",
    "Return the result instead of printing it.",
)
#: `--turns retry`: each later turn is the task again after a tool result, as an agent loop re-issues a step (the
#: target's answer is then mostly, not always, the one it wrote before)
RETRY = "Tool result: attempt {turn} did not finish. Do the same step again."
#: what `--kind` may be (`conversations`)
KINDS = ("retry", "rewrite", "repeat")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.session_replay", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--target", default="smollm2-135m", help="alias, GGUF file or HF dir (default: %(default)s)")
    p.add_argument("--draft", default="auto", help="drafter spec (default: %(default)s, the served default)")
    p.add_argument("--conversations", type=int, default=4, help="sessions, one coding task each")
    p.add_argument("--turns", type=int, default=4, help="requests per session, the first untimed")
    p.add_argument(
        "--kind",
        choices=KINDS,
        default="retry",
        help="later turns: the task re-issued after a tool result, with more change requests, or unchanged",
    )
    p.add_argument("--max-tokens", type=int, default=128, help="new tokens per request (default: %(default)s)")
    p.add_argument("--num-speculative-tokens", type=int, default=7, help="draft tokens a round at most")
    p.add_argument("--out", default=str(REPO_ROOT / "bench" / "results" / "session_replay.json"))
    return p.parse_args(argv)


def conversations(count: int, turns: int, kind: str = "retry") -> list[list[str]]:
    """Per conversation, the user message of each turn: a task from datasets/eval/mbpp.jsonl, then the task again
    after a tool result (`retry`), with more change requests (`rewrite`) or unchanged (`repeat`)."""
    from deepspec.paths import eval_dataset

    tasks = [json.loads(line)["turns"][0] for line in eval_dataset("mbpp").read_text().splitlines()[:count]]
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if kind == "repeat":
        return [[task] * turns for task in tasks]
    if kind == "retry":
        return [[task] + [f"{task}\n\n{RETRY.format(turn=t)}" for t in range(1, turns)] for task in tasks]
    return [[task] + [f"{task}\n\n{' '.join(EDITS[:t])}" for t in range(1, turns)] for task in tasks]


def run_row(target, draft: str, convs: list[list[str]], max_tokens: int, k: int, sessions: bool) -> dict:
    from deepspec.decoding import SamplingParams, SpecEngine, build_drafter
    from deepspec.decoding.planner import BudgetPlanner

    drafter = None if draft == "none" else build_drafter(draft, target)
    engine = SpecEngine(
        target,
        drafter,
        max_batch_size=1,
        max_seq_len=2048,
        num_speculative_tokens=k,
        planner=BudgetPlanner() if drafter is not None else None,
    )
    engine.generate([target.encode_chat([{"role": "user", "content": "Hi"}])], SamplingParams(max_tokens=8))
    engine.forget_acceptance()  # the warm-up is not traffic
    seconds, tokens, rounds, accepted, outputs = 0.0, 0, 0, 0, []
    for c, turns in enumerate(convs):
        params = SamplingParams(max_tokens=max_tokens, session=f"bench:conversation-{c}" if sessions else None)
        for t, text in enumerate(turns):
            prompt = target.encode_chat([{"role": "user", "content": text}])
            start = time.perf_counter()
            result = engine.generate([prompt], params)[0]
            if t:  # the first turn only fills the memory
                seconds += time.perf_counter() - start
                tokens += len(result.token_ids)
                rounds += result.num_steps
                accepted += result.num_accepted_tokens
            outputs.append(result.token_ids)
    return {
        "tok_s": tokens / seconds,
        "tokens": tokens,
        "tokens_per_forward": (accepted + rounds) / max(rounds, 1),
        "outputs": outputs,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    from bench.machine import cpu_flags, write_results
    from deepspec.models.native import load_native_target

    target = load_native_target(args.target)
    convs = conversations(args.conversations, args.turns, args.kind)
    rows = {
        "--draft none": run_row(target, "none", convs, args.max_tokens, args.num_speculative_tokens, False),
        f"{args.draft}, no session": run_row(
            target, args.draft, convs, args.max_tokens, args.num_speculative_tokens, False
        ),
        f"{args.draft}, session memory": run_row(
            target, args.draft, convs, args.max_tokens, args.num_speculative_tokens, True
        ),
    }
    base = rows["--draft none"]
    print(
        f"target {args.target} (native {target.quantization}), {args.conversations} sessions x {args.turns} turns "
        f"({args.kind}) "
        f"x {args.max_tokens} tokens (first turn untimed), batch 1, greedy, k={args.num_speculative_tokens}; "
        f"CPU flags: {cpu_flags()}"
    )
    print("| row | tok/s | tokens per forward | ratio to --draft none | outputs identical |")
    print("| --- | --- | --- | --- | --- |")
    for name, r in rows.items():
        same = r["outputs"] == base["outputs"]
        print(
            f"| {name} | {r['tok_s']:.1f} | {r['tokens_per_forward']:.2f} | {r['tok_s'] / base['tok_s']:.2f}x | "
            f"{'yes' if same else '**NO**'} |"
        )
    write_results(args.out, args, rows={n: {k: v for k, v in r.items() if k != "outputs"} for n, r in rows.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
