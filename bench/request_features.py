"""What the OpenAI request features cost under speculation: structured outputs and top-N logprobs, each against the
same requests without them, with the default draft, at batch 1 on the default target.

    python -m bench.request_features                      # ~5 min on 2 cores
                                                          # (writes bench/results/request_features.json)
    python -m bench.request_features --num-prompts 2 --max-tokens 32   # a smoke run

Rows, every prompt decoded by each in turn (interleaved: this VM's speed drifts by tens of percent over minutes, so
a ratio of runs minutes apart would measure the drift):

    free                 the chat prompt, greedy, the default draft (`auto`)
    json_schema          the same prompt with its JSON schema as a structured-output constraint
    json_schema, no draft  the constrained request target-only: what the draft buys under the grammar
    logprobs top-5       the free request asking for each token's logprob and its 5 likeliest alternatives

Reports decode tok/s (tokens after the first ÷ the time after the first: a constrained answer is a quarter as long
as a free one, so a figure that counted the prefill would charge it to the grammar), its median over prompts and
the ratio to `free`, the median time to first token; τ (accepted drafts + 1 per drafted round, pooled); and
for the constrained rows the share of outputs that parse as JSON and validate against their schema.
Targets (issue 25): json_schema ≥ 0.8x free tok/s with 100% valid outputs; logprobs top-5 costs ≤ 10%.
The grammar's compile time (once per schema; xgrammar caches it) is reported apart, outside the timings.
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

#: (instruction, JSON schema): small extraction tasks of the kind apps send with response_format json_schema
TASKS = [
    (
        "Extract the person as JSON: Alice Smith is 34 and lives in Paris.",
        {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
            "required": ["name", "age", "city"],
            "additionalProperties": False,
        },
    ),
    (
        "Give the book as JSON: '1984' was written by George Orwell and published in 1949.",
        {
            "type": "object",
            "properties": {"title": {"type": "string"}, "author": {"type": "string"}, "year": {"type": "integer"}},
            "required": ["title", "author", "year"],
            "additionalProperties": False,
        },
    ),
    (
        "List three primary colors as JSON.",
        {
            "type": "object",
            "properties": {"colors": {"type": "array", "items": {"type": "string"}, "minItems": 3, "maxItems": 3}},
            "required": ["colors"],
            "additionalProperties": False,
        },
    ),
    (
        "Is 17 a prime number? Answer as JSON with the number and a boolean.",
        {
            "type": "object",
            "properties": {"number": {"type": "integer"}, "is_prime": {"type": "boolean"}},
            "required": ["number", "is_prime"],
            "additionalProperties": False,
        },
    ),
    (
        "Describe the weather in Rome today as JSON: temperature in Celsius and a one-word condition.",
        {
            "type": "object",
            "properties": {
                "temperature_c": {"type": "number"},
                "condition": {"type": "string", "enum": ["sunny", "cloudy", "rainy"]},
            },
            "required": ["temperature_c", "condition"],
            "additionalProperties": False,
        },
    ),
    (
        "Convert to JSON: the order has id 1042, two items, and was paid.",
        {
            "type": "object",
            "properties": {"order_id": {"type": "integer"}, "items": {"type": "integer"}, "paid": {"type": "boolean"}},
            "required": ["order_id", "items", "paid"],
            "additionalProperties": False,
        },
    ),
]


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m bench.request_features",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--target", default="smollm2-135m", help="alias, GGUF file or HF dir (default: %(default)s)")
    p.add_argument("--draft", default="auto", help="drafter spec for the drafted rows (default: %(default)s)")
    p.add_argument("--num-prompts", type=int, default=len(TASKS), help="tasks to run (default: all %(default)s)")
    p.add_argument("--max-tokens", type=int, default=96, help="new tokens per request at most (default: 96)")
    p.add_argument("--repeats", type=int, default=2, help="timed passes over the prompts (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--out", default=str(REPO_ROOT / "bench" / "results" / "request_features.json"))
    return p.parse_args(argv)


def _valid(text: str, schema: dict) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from bench.machine import cpu_flags
    from deepspec.decoding import SamplingParams, SpecEngine
    from deepspec.decoding.planner import BudgetPlanner
    from deepspec.decoding.registry import build_drafter
    from deepspec.decoding.structured import StructuredOutput
    from deepspec.models import load_target

    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_target(args.target)
    drafter = build_drafter(args.draft, target)
    drafted = SpecEngine(target, drafter, max_batch_size=1, max_seq_len=1024, planner=BudgetPlanner())
    plain = SpecEngine(target, None, max_batch_size=1, max_seq_len=1024)
    tasks = TASKS[: args.num_prompts]
    prompts = [target.encode_chat([{"role": "user", "content": text}]) for text, _ in tasks]

    compile_seconds = []
    constraints = []
    for _, schema in tasks:
        constraint = StructuredOutput("json_schema", json.dumps(schema))
        t0 = time.perf_counter()
        drafted.validate(prompts[0], SamplingParams(max_tokens=1, structured=constraint))  # compiles; cached after
        compile_seconds.append(time.perf_counter() - t0)
        constraints.append(constraint)

    def rows_for(i):
        free = SamplingParams(max_tokens=args.max_tokens)
        schema = SamplingParams(max_tokens=args.max_tokens, structured=constraints[i])
        return [
            ("free", drafted, free),
            ("json_schema", drafted, schema),
            ("json_schema, no draft", plain, schema),
            ("logprobs top-5", drafted, SamplingParams(max_tokens=args.max_tokens, logprobs=5)),
        ]

    names = [name for name, _, _ in rows_for(0)]
    records = {name: [] for name in names}
    drafted.generate([prompts[0]], SamplingParams(max_tokens=16))  # warm caches and allocator pools, untimed
    plain.generate([prompts[0]], SamplingParams(max_tokens=16))
    for _ in range(args.repeats):
        for i, prompt in enumerate(prompts):
            for name, engine, params in rows_for(i):
                t0 = time.perf_counter()
                result, first_token_at = _timed_generate(engine, prompt, params)
                end = time.perf_counter()
                records[name].append(
                    {
                        "task": i,
                        "tokens": len(result.token_ids),
                        "seconds": end - first_token_at,
                        "ttft": first_token_at - t0,
                        "accepted": result.num_accepted_tokens,
                        "drafted_rounds": _drafted_rounds(result),
                        "valid": _valid(result.text, tasks[i][1]) if params.structured else None,
                        "text": result.text,
                    }
                )

    table = {}
    for name in names:
        rs = records[name]
        per_prompt = [(r["tokens"] - 1) / r["seconds"] for r in rs if r["seconds"] > 0 and r["tokens"] > 1]
        rounds = sum(r["drafted_rounds"] for r in rs)
        valid = [r["valid"] for r in rs if r["valid"] is not None]
        table[name] = {
            "tok_s": sum(r["tokens"] - 1 for r in rs) / sum(r["seconds"] for r in rs),
            "ttft_ms_median": statistics.median(r["ttft"] for r in rs) * 1000,
            "tok_s_median": statistics.median(per_prompt),
            "tau": (sum(r["accepted"] for r in rs) + rounds) / rounds if rounds else None,
            "valid": (sum(valid) / len(valid)) if valid else None,
            "mean_tokens": statistics.mean(r["tokens"] for r in rs),
        }
    base = table["free"]["tok_s_median"]
    for row in table.values():
        row["ratio"] = row["tok_s_median"] / base
    draft_name = getattr(drafter, "name", str(drafter))
    print(
        f"target {args.target}, draft {args.draft} ({draft_name}), batch 1, greedy, {len(prompts)} prompts x "
        f"{args.repeats}, max {args.max_tokens} tokens, torch threads {torch.get_num_threads()}"
    )
    print(
        f"CPU flags: {cpu_flags()}; grammar compile per schema: first {compile_seconds[0] * 1000:.0f} ms (with the "
        f"vocabulary), then median {statistics.median(compile_seconds[1:] or compile_seconds) * 1000:.0f} ms"
    )
    print(
        f"{'row':24s} {'decode tok/s (median)':>22s} {'ratio':>6s} {'TTFT ms':>8s} {'tau':>5s} {'valid':>6s} "
        f"{'tokens':>7s}"
    )
    for name, row in table.items():
        tau = f"{row['tau']:.2f}" if row["tau"] else "-"
        valid = f"{row['valid']:.0%}" if row["valid"] is not None else "-"
        print(
            f"{name:24s} {row['tok_s_median']:22.1f} {row['ratio']:5.2f}x {row['ttft_ms_median']:8.0f} {tau:>5s} "
            f"{valid:>6s} {row['mean_tokens']:7.1f}"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "args": vars(args),
                "cpu_flags": cpu_flags(),
                "draft": draft_name,
                "compile_seconds": compile_seconds,
                "table": table,
                "records": records,
            },
            indent=1,
        )
    )
    print(f"wrote {out}")
    return 0


def _timed_generate(engine, prompt: list[int], params):
    """→ (the request's result, when its first token was streamed)."""
    token_times: list[float] = []

    def on_output(out) -> None:
        if out.new_token_ids and not token_times:
            token_times.append(time.perf_counter())

    return engine.generate([prompt], params, on_output=on_output)[0], token_times[0]


def _drafted_rounds(result) -> int:
    """Verify rounds that verified at least one draft: τ's denominator (the engine counts every round)."""
    return result.proposed_per_position[0] if result.proposed_per_position else 0


if __name__ == "__main__":
    sys.exit(main())
