"""Where an engine round's time goes: the target's verify forward against everything else the engine does per round.

    python -m bench.round_overhead                 # ~3 min on 2 cores; writes bench/results/round_overhead.json
    python -m bench.round_overhead --num-prompts 1 --max-tokens 16 --batch-sizes 1   # a smoke run
    python -m bench.round_overhead --backend native --datasets chat --distinct   # the served case on held-out chat

Each row decodes the same prompts (N each from humaneval, gsm8k and mbpp, chat template, a fixed number of new
tokens; greedy, or at each of --temperatures with fixed seeds, top-p 1) with the engine's phase timer on
(deepspec/decoding/phases.py), at batch 1 and at batch 8 (8 copies of each prompt decoding together, so every round
verifies 8 rows; with --distinct, 8 different prompts, as a server's batch holds, so rows accept differently):

    engine                 target-only: the floor of per-round overhead (commit, detokenization, slot bookkeeping)
    engine+auto            the default draft (`--draft auto`): what drafting, the budget and acceptance add
    engine+prompt-lookup   the corpus-free lookup draft

Reports per step (one prefill or decode round) the milliseconds of each phase: draft (proposing), budget (the
verification budget's depth or node choice), grammar, target (the verify forward), verify (the acceptance op and
reading its result back), kv (tree KV compaction), logprobs, commit (stop checks, incremental detokenization),
draft_update (the drafter hearing the committed tokens), release (slot moves), prefill and other (Python glue
between phases); and the share of a decode round (a step less its prefill) spent outside the target's forward: the
engine's own overhead (issue 24: less work outside the graph per round).

Then the cost of a draft token beside a one-token target step (issue 45: drafting one token should cost <= 5% of
one), for each Eagle3 draft of --draft-cost on each backend (torch: the PyTorch module; native: the draft in the
native decoder's library on its default weights — the draft's own 4-bit blocks where it ships in them — and on int8;
native only on --backend native): the first prompt prefilled into
every row at once, its features committed to the drafter, then the median of --cost-repeats chains of
--cost-tokens draft tokens for all rows (`propose`, everything drafting does: the draft's steps, picking tokens,
packing the proposal) per draft token, against the median one-token target step of those rows (a forward with the
draft's feature layers, logits at the token).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from deepspec.models.backends import NATIVE, PYTORCH

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m bench.round_overhead", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--target", default="smollm2-135m", help="alias, GGUF file or HF dir (default: %(default)s)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"], help="weights and activations")
    p.add_argument(
        "--backend",
        "--engine",
        default=PYTORCH,
        choices=[PYTORCH, NATIVE],
        help="pytorch: the lean PyTorch decoder (or an ONNX export's graph, --target <dir>); native: the "
        "native CPU decoder on its own choice of weights (default: %(default)s)",
    )
    p.add_argument(
        "--drafters",
        default="none,auto,prompt-lookup",
        help="comma list of drafter specs, each with options after a colon (drafts/smollm2-135m-eagle3:backend=torch)",
    )
    p.add_argument("--batch-sizes", default="1,8", help="comma list (default: %(default)s)")
    p.add_argument("--num-prompts", type=int, default=2, help="prompts per dataset (default: %(default)s)")
    p.add_argument("--datasets", default="humaneval,gsm8k,mbpp", help="comma list of datasets/eval sets")
    p.add_argument(
        "--distinct", action="store_true", help="a batch's rows are different prompts (default: copies of one prompt)"
    )
    p.add_argument("--max-tokens", type=int, default=64, help="new tokens per prompt (default: %(default)s)")
    p.add_argument(
        "--temperatures",
        default="0",
        help="comma list of sampling temperatures, each its own rows (top-p 1; default: %(default)s)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument(
        "--draft-cost",
        default=str(REPO_ROOT / "drafts" / "smollm2-135m-eagle3"),
        help="comma list of Eagle3 draft directories whose cost per draft token to measure ('' = none; "
        "default: the shipped one)",
    )
    p.add_argument("--cost-tokens", type=int, default=4, help="draft tokens per measured chain (default: %(default)s)")
    p.add_argument(
        "--cost-repeats", type=int, default=30, help="chains (and target steps) timed (default: %(default)s)"
    )
    p.add_argument("--out", default=str(REPO_ROOT / "bench" / "results" / "round_overhead.json"))
    args = p.parse_args(argv)
    if "--engine" in (sys.argv[1:] if argv is None else argv):
        print("python -m bench.round_overhead: warning: --engine is deprecated: use --backend", file=sys.stderr)
    return args


def profile_row(
    target,
    drafter,
    prompts: list[list[int]],
    batch: int,
    max_tokens: int,
    temperature: float = 0.0,
    distinct: bool = False,
) -> dict:
    """Decode `prompts` (each `batch` times at once, or with `distinct` `batch` of them at once; sampled at
    `temperature` with fixed seeds where it is above 0) on a fresh engine with the phase timer on."""
    from deepspec.decoding import SamplingParams, SpecEngine
    from deepspec.decoding.planner import BudgetPlanner

    engine = SpecEngine(target, drafter, max_batch_size=batch, max_seq_len=2048, planner=BudgetPlanner())
    params = SamplingParams(
        max_tokens=max_tokens, ignore_eos=True, temperature=temperature, seed=0 if temperature > 0 else None
    )
    engine.generate([prompts[0]], SamplingParams(max_tokens=16))  # warm caches and allocator pools, untimed
    timer = engine.profile()
    tokens, t0 = 0, time.perf_counter()
    groups = (
        [prompts[i : i + batch] for i in range(0, len(prompts), batch)]
        if distinct
        else [[prompt] * batch for prompt in prompts]
    )
    for group in groups:
        tokens += sum(len(r.token_ids) for r in engine.generate(group, params))
    seconds = time.perf_counter() - t0
    per_step = timer.per_step_ms()
    step_ms = timer.seconds["step"] * 1e3 / max(timer.calls["step"], 1)
    round_ms = step_ms - per_step.get("prefill", 0.0)  # a step's decode round and the bookkeeping around it
    return {
        "steps": timer.calls["step"],
        "step_ms": step_ms,
        "phases_ms": per_step,
        "tok_s": tokens / seconds,
        "tokens_per_step": tokens / max(timer.calls["step"], 1) / batch,
        "round_ms": round_ms,
        "outside_target": 1 - per_step.get("target", 0.0) / round_ms if round_ms else None,
    }


def _timed_ms(fn, repeats: int) -> tuple[float, float, float]:
    """(median, fastest, median CPU) ms of `repeats` calls. On a shared machine the wall clock counts the time the
    call waited for a core; the fastest call and the CPU time this process spent (all its threads, a spinning pool
    worker included) count less of it: the figures to compare there."""
    fn()  # warm: caches, allocator pools, the pool's threads
    times, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    times.sort()
    cpu.sort()
    return times[len(times) // 2] * 1e3, times[0] * 1e3, cpu[len(cpu) // 2] * 1e3


def draft_cost(target, drafter, prompt: list[int], batch: int, k: int, repeats: int) -> dict:
    """ms per draft token of a k-token chain for `batch` rows (`drafter.propose`), and of a one-token target step
    of those rows, after `prompt` is prefilled into every row and its features committed (module docstring)."""
    import torch

    from deepspec.decoding.draft_driver import DraftDriver
    from deepspec.decoding.host_threads import torch_threads

    layers = tuple(drafter.feature_layers)
    cache = target.new_cache(batch, 2048)
    start = torch.zeros(batch, dtype=torch.long)
    tokens = torch.tensor([prompt] * batch)
    out = target.forward(tokens, start, cache.rows(0, batch), feature_layers=layers, logits="last")
    first = out.logits[:, -1].argmax(-1)
    driver = DraftDriver(drafter, num_slots=batch, max_tokens=2048, target=target)
    for b in range(batch):
        driver.start(b, [*prompt, int(first[b])], out.features[b : b + 1])
    slots = list(range(batch))
    step = start + len(prompt)
    with torch_threads(target.host_threads):  # torch's threads as the engine sets them while it steps this target
        draft_ms, draft_fastest, draft_cpu = _timed_ms(lambda: driver.propose(slots, k), repeats)
        target_ms, target_fastest, target_cpu = _timed_ms(
            lambda: target.forward(first[:, None], step, cache.rows(0, batch), feature_layers=layers, logits="all"),
            repeats,
        )
    return {
        "draft_ms_per_token": draft_ms / k,
        "target_step_ms": target_ms,
        "share": draft_ms / k / target_ms,
        "fastest_draft_ms_per_token": draft_fastest / k,
        "fastest_target_step_ms": target_fastest,
        "fastest_share": draft_fastest / k / target_fastest,
        "cpu_draft_ms_per_token": draft_cpu / k,
        "cpu_target_step_ms": target_cpu,
        "cpu_share": draft_cpu / k / target_cpu,
    }


def draft_cost_rows(target, args, prompt: list[int], native: bool) -> dict:
    """draft_cost for each draft of --draft-cost, backend (torch; native int8 and q4 on a native target) and batch."""
    from deepspec.decoding import build_drafter

    variants = [("torch", {"backend": "torch"})]
    if native:
        variants += [("native", {"backend": "native"}), ("native int8", {"backend": "native", "weights": "int8"})]
    rows = {}
    for path in filter(None, args.draft_cost.split(",")):
        for label, options in variants:
            for batch in map(int, args.batch_sizes.split(",")):
                name = f"{Path(path).name}[{label}] B={batch}"
                drafter = build_drafter(path, target, **options)
                rows[name] = draft_cost(target, drafter, prompt, batch, args.cost_tokens, args.cost_repeats)
                r = rows[name]
                print(
                    f"{name}: {r['draft_ms_per_token']:.3f} ms a draft token, target step {r['target_step_ms']:.2f} "
                    f"ms ({r['share']:.1%}; fastest {r['fastest_share']:.1%}, CPU time {r['cpu_share']:.1%})",
                    file=sys.stderr,
                )
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from bench.decode import load_prompts
    from bench.machine import cpu_flags
    from deepspec.decoding.phases import PHASES
    from deepspec.models import load_target
    from training.draft_specs import parse_draft_spec

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.backend == NATIVE:
        from deepspec.models.native import load_native_target

        target = load_native_target(args.target)
    else:
        target = load_target(args.target, dtype=args.dtype)
    prompts = [p for ps in load_prompts(target, args.num_prompts, args.datasets.split(",")).values() for p in ps]
    rows = {}
    for temperature in map(float, args.temperatures.split(",")):
        for spec in args.drafters.split(","):
            for batch in map(int, args.batch_sizes.split(",")):
                name = f"engine{'' if spec == 'none' else '+' + spec} B={batch}" + (
                    f" t={temperature:g}" if temperature else ""
                )
                drafter = parse_draft_spec(spec).build(target)
                rows[name] = profile_row(target, drafter, prompts, batch, args.max_tokens, temperature, args.distinct)
                print(
                    f"{name}: {rows[name]['tok_s']:.1f} tok/s, {rows[name]['tokens_per_step']:.2f} tokens/step/row",
                    file=sys.stderr,
                )
    costs = draft_cost_rows(target, args, prompts[0], args.backend == NATIVE)
    columns = [c for c in (*PHASES, "other") if any(r["phases_ms"].get(c, 0) >= 0.05 for r in rows.values())]
    weights = f"native {target.quantization}" if args.backend == NATIVE else args.dtype
    print(
        f"target {args.target} ({weights}), {len(prompts)} prompts x {args.max_tokens} tokens, temperatures "
        f"{args.temperatures}, "
        f"torch threads {torch.get_num_threads()}; CPU flags: {cpu_flags()}"
    )
    print("ms per step by phase")
    print(
        f"{'row':26s} {'tok/s':>6s} {'step':>7s} "
        + " ".join(f"{c[:8]:>8s}" for c in columns)
        + "  round outside target"
    )
    for name, r in rows.items():
        phases = " ".join(f"{r['phases_ms'].get(c, 0.0):8.2f}" for c in columns)
        print(f"{name:26s} {r['tok_s']:6.1f} {r['step_ms']:7.2f} {phases}  {r['outside_target']:.1%}")
    if costs:
        print(
            f"draft cost: {args.cost_tokens}-token chains, median, fastest and median CPU time of {args.cost_repeats}"
        )
        print(f"{'draft[backend] batch':38s} {'ms/draft token':>24s} {'target step ms':>24s} {'share':>22s}")
        for name, r in costs.items():
            print(
                f"{name:38s} {r['draft_ms_per_token']:7.3f} {r['fastest_draft_ms_per_token']:7.3f} "
                f"{r['cpu_draft_ms_per_token']:7.3f}  {r['target_step_ms']:7.2f} {r['fastest_target_step_ms']:7.2f} "
                f"{r['cpu_target_step_ms']:7.2f}  {r['share']:6.1%} {r['fastest_share']:6.1%} {r['cpu_share']:6.1%}"
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"args": vars(args), "cpu_flags": cpu_flags(), "rows": rows, "draft_cost": costs}
    out.write_text(json.dumps(report, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
