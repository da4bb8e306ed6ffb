"""Evaluation of a draft against its target: acceptance length τ, verify rate, per-position survival, and the
wall-clock speedup over target-only decoding — both measured in the same process on the same prompts.

Writes eval.json (machine-readable; `best_shipped_draft` ranks drafts by its greedy τ), eval.md (a table) and
acceptance.png (per-position survival). Greedy runs also check that the draft's output is token-for-token the
target-only output (lossless verification in fp32).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from deepspec.decoding.params import AcceptanceStats


@dataclass
class EvalResult:
    """One (draft, dataset, temperature) row of eval.json; `summarize` says what each rate divides by."""

    dataset: str
    temperature: float
    num_prompts: int
    #: τ: (accepted drafts + drafted rounds) / drafted rounds (num_drafted_steps); None when no round drafted
    acceptance_length: float | None
    #: committed tokens / tokens verified, over every verify pass (num_steps)
    verify_rate: float
    #: per draft position: rounds it was accepted / rounds it was proposed
    survival: list[float]
    tokens_per_second: float
    baseline_tokens_per_second: float
    speedup: float
    num_generated_tokens: int
    identical_to_target: bool | None = None
    #: mean tokens each verify pass scored (the pending token + the chain's drafts or the tree's nodes)
    verify_tokens_per_step: float | None = None
    #: the draft proposed token trees (a chain otherwise)
    tree: bool = False
    #: verify passes over the set's requests, drafted or not (verify_rate's and verify_tokens_per_step's rounds)
    num_steps: int | None = None
    #: of those, the passes that verified at least one draft: τ's denominator, so sets can be pooled
    #: (Σ τ·num_drafted_steps / Σ num_drafted_steps)
    num_drafted_steps: int | None = None
    #: tokens committed per verify pass over every round, drafted or not (AcceptanceStats.tokens_per_forward):
    #: beside τ, so a draft that rarely drafts cannot look good
    tokens_per_forward: float | None = None
    extra: dict = field(default_factory=dict)


def load_eval_prompts(name: str, count: int) -> list[str]:
    """The first `count` first turns of an eval set: a name under datasets/eval, or a `{"turns"}` JSON-lines file
    (plain or .gz) such as the synthetic held-out split, which no draft trains on."""
    from deepspec.paths import datasets_dir
    from training.data import read_jsonl_lines

    path = Path(name) if name.endswith((".jsonl", ".jsonl.gz")) else datasets_dir() / "eval" / f"{name}.jsonl"
    if not path.is_file():
        available = sorted(p.stem for p in (datasets_dir() / "eval").glob("*.jsonl"))
        raise FileNotFoundError(f"eval dataset '{name}' not found at {path}; available: {available} or a .jsonl file")
    return [json.loads(line)["turns"][0] for line in read_jsonl_lines(path)[:count]]


def eval_set_name(name: str) -> str:
    """What results call a set: a datasets/eval name as it is, a file by its stem (`prompts.heldout`)."""
    from training.data import jsonl_stem

    return jsonl_stem(name) if name.endswith((".jsonl", ".jsonl.gz")) else name


def _run(engine, prompts, params, progress=None, **fields) -> tuple[list, float]:
    """Decode every prompt (one at a time at batch size 1, else all together) → (results, seconds of decoding).
    The progress display advances per prompt, outside the timed decodes."""
    seconds, results = 0.0, []
    batches = [[p] for p in prompts] if engine.max_batch_size == 1 else [prompts]
    for batch in batches:
        start = time.perf_counter()
        done = engine.generate(batch, params)
        seconds += time.perf_counter() - start
        results.extend(done)
        if progress is not None:
            progress.advance(len(batch), tokens=sum(len(r.token_ids) for r in done), **fields)
    return results, seconds


def pooled_stats(results) -> AcceptanceStats:
    """Every request's counters summed into one AcceptanceStats, so a set's τ is the engine's own definition
    (AcceptanceStats.acceptance_length) over all its rounds, not a mean of per-request figures."""
    width = max((len(r.proposed_per_position) for r in results), default=0)

    def per_position(lists) -> list[int]:
        return [sum(values[i] for values in lists if i < len(values)) for i in range(width)]

    return AcceptanceStats(
        num_steps=sum(r.num_steps for r in results),
        num_drafted_steps=sum(r.num_drafted_steps for r in results),
        num_draft_tokens=sum(r.num_draft_tokens for r in results),
        num_accepted_tokens=sum(r.num_accepted_tokens for r in results),
        num_verify_tokens=sum(r.num_verify_tokens for r in results),
        accepted_per_position=per_position([r.accepted_per_position for r in results]),
        proposed_per_position=per_position([r.proposed_per_position for r in results]),
    )


def summarize(results) -> tuple[float | None, float, list[float]]:
    """(τ, verify rate, survival) of a set's requests, pooled:

    - τ = (accepted drafts + drafted rounds) / drafted rounds, the rounds that verified at least one draft (a
      round the verify budget or the drafter left without drafts is not counted); None when no round drafted.
    - verify rate = committed tokens / tokens the target verified = (accepted + rounds) / (drafts + rounds), over
      every verify pass, drafted or not: the share of the verify passes' tokens that were kept.
    - survival[i] = rounds in which draft position i was accepted / rounds that proposed position i (0 where none
      did); in a chain, position i is only accepted after every earlier one was."""
    pooled = pooled_stats(results)
    committed = pooled.num_accepted_tokens + pooled.num_steps
    verify_rate = committed / max(pooled.num_draft_tokens + pooled.num_steps, 1)
    survival = [a / p if p else 0.0 for a, p in zip(pooled.accepted_per_position, pooled.proposed_per_position)]
    return pooled.acceptance_length, verify_rate, survival


def verify_tokens_per_step(results) -> float:
    """Mean tokens scored per verify pass: what a tree spends for its τ (a chain of d drafts scores 1 + d).
    From the engine's own count where it keeps one, else 1 + drafts per step."""
    steps = sum(r.num_steps for r in results)
    counted = sum(getattr(r, "num_verify_tokens", 0) or 0 for r in results)
    if not counted:
        counted = sum(r.num_draft_tokens for r in results) + steps
    return counted / max(steps, 1)


def evaluate(
    target,
    drafters: dict,
    datasets: list[str],
    num_prompts: int,
    max_tokens: int,
    temperatures: list[float],
    num_speculative_tokens: int = 7,
    batch_size: int = 1,
    check_identical: bool = True,
    on_result=None,
    verify_budget: bool = True,
    show_progress: bool = True,
) -> dict[str, list[EvalResult]]:
    """drafters: name → Drafter. Target-only runs once per (dataset, temperature) and every draft is timed right
    after it on the same prompts, so each speedup compares runs minutes apart on the same machine state.

    verify_budget=False verifies every token or node a draft proposes (up to num_speculative_tokens), as vLLM's
    fixed `num_speculative_tokens` does: τ is then the draft's own acceptance, not cut to what pays on this
    machine's step time (deepspec/decoding/planner.py BudgetPlanner), and the speedup says what that costs."""
    from deepspec.decoding.engine import SpecEngine
    from deepspec.decoding.params import SamplingParams
    from deepspec.decoding.planner import BudgetPlanner, RoundPlanner
    from training.progress import Progress

    max_seq_len = 2048
    base = SpecEngine(target, None, max_batch_size=batch_size, max_seq_len=max_seq_len)
    engines = {
        name: SpecEngine(
            target,
            d,
            max_batch_size=batch_size,
            max_seq_len=max_seq_len,
            num_speculative_tokens=num_speculative_tokens,
            planner=BudgetPlanner() if verify_budget else RoundPlanner(),
        )
        for name, d in drafters.items()
    }
    warm = [target.encode_chat([{"role": "user", "content": "Hi"}])]
    for engine in (base, *engines.values()):  # first calls pay one-off allocation costs; keep them out of timing
        engine.generate(warm, SamplingParams(max_tokens=8))
        engine.forget_acceptance()  # and out of the budget's prior
    out: dict[str, list[EvalResult]] = {name: [] for name in drafters}
    sets = {
        eval_set_name(name): [
            target.encode_chat([{"role": "user", "content": p}]) for p in load_eval_prompts(name, num_prompts)
        ]
        for name in datasets
    }
    total = sum(len(p) for p in sets.values()) * len(temperatures) * (1 + len(engines))
    with Progress(total, "eval", enabled=show_progress) as progress:
        for name, prompts in sets.items():
            for temperature in temperatures:
                for draft_name, result in _evaluate_set(
                    name, prompts, temperature, base, engines, max_tokens, check_identical, progress
                ):
                    out[draft_name].append(result)
                    if on_result is not None:
                        on_result(draft_name, result)
    return out


def _evaluate_set(name, prompts, temperature, base, engines, max_tokens, check_identical, progress):
    """One (dataset, temperature): target-only, then each draft right after it on the same prompts; yields
    (draft name, EvalResult) as each draft finishes."""
    from deepspec.decoding.params import SamplingParams
    from training.draft_specs import is_tree_drafter

    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=0)
    where = {"set": name, "T": temperature}
    base_results, base_s = _run(base, prompts, params, progress, **where, method="target-only")
    n_base = sum(len(r.token_ids) for r in base_results)
    for draft_name, engine in engines.items():
        spec_results, spec_s = _run(engine, prompts, params, progress, **where, method=Path(draft_name).name)
        n_spec = sum(len(r.token_ids) for r in spec_results)
        tau, verify_rate, survival = summarize(spec_results)
        pooled = pooled_stats(spec_results)
        identical = None
        if temperature == 0 and check_identical:
            identical = all(a.token_ids == b.token_ids for a, b in zip(base_results, spec_results))
        result = EvalResult(
            name,
            temperature,
            len(prompts),
            None if tau is None else round(tau, 4),
            round(verify_rate, 4),
            [round(x, 4) for x in survival],
            round(n_spec / spec_s, 2),
            round(n_base / base_s, 2),
            round((n_spec / spec_s) / (n_base / base_s), 3),
            n_spec,
            identical,
            verify_tokens_per_step=round(verify_tokens_per_step(spec_results), 3),
            tree=is_tree_drafter(engine.drafter),
            num_steps=pooled.num_steps,
            num_drafted_steps=pooled.num_drafted_steps,
            tokens_per_forward=None if pooled.tokens_per_forward is None else round(pooled.tokens_per_forward, 4),
        )
        yield draft_name, result


def tau_text(tau: float | None) -> str:
    """τ as the reports print it: two decimals, "-" for a set where no round drafted."""
    return "-" if tau is None else f"{tau:.2f}"


def eval_markdown(results: list[EvalResult], meta: dict) -> str:
    """eval.md: one row per (set, temperature) of an eval.json, and its settings (training/draft_table.py renders
    the shipped drafts' reports with it)."""
    lines = [
        f"# {meta.get('draft', 'draft')} on {meta.get('target', 'target')}",
        "",
        "| dataset | temp | τ | tokens per forward | verify tok/step | verify rate | draft tok/s "
        "| target-only tok/s | speedup | identical |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        same = "" if r.identical_to_target is None else ("yes" if r.identical_to_target else "**NO**")
        vps = "" if r.verify_tokens_per_step is None else f"{r.verify_tokens_per_step:.2f}"
        per_forward = "" if r.tokens_per_forward is None else f"{r.tokens_per_forward:.2f}"
        lines.append(
            f"| {r.dataset} | {r.temperature:g} | {tau_text(r.acceptance_length)} | {per_forward} | {vps} | "
            f"{r.verify_rate:.2f} | {r.tokens_per_second:.1f} | {r.baseline_tokens_per_second:.1f} | "
            f"{r.speedup:.2f}x | {same} |"
        )
    return "\n".join(lines + ["", f"Settings: {json.dumps(meta.get('settings', {}))}", ""])


def write_reports(results: list[EvalResult], out_dir: Path, meta: dict) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {**meta, "results": [asdict(r) for r in results]}
    (out_dir / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / "eval.md").write_text(eval_markdown(results, meta))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for r in results:
            ax.plot(
                range(1, len(r.survival) + 1),
                r.survival,
                marker="o",
                label=f"{r.dataset} T={r.temperature:g} (τ={tau_text(r.acceptance_length)})",
            )
        ax.set_xlabel("draft position")
        ax.set_ylabel("survival (accepted | proposed, earlier accepted)")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax.set_title(f"{meta.get('draft', 'draft')}: per-position acceptance")
        fig.tight_layout()
        fig.savefig(out_dir / "acceptance.png", dpi=100)
        plt.close(fig)
    except ImportError:
        pass  # matplotlib is in the `train` extra; the JSON and markdown reports are still written
    return report


def comparison_table(results: dict[str, list[EvalResult]]) -> str:
    """Every draft's rows side by side (markdown): trees next to chains, τ against what each verify pass cost."""
    lines = [
        "| draft | shape | dataset | temp | τ | verify tok/step | speedup |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, rows in results.items():
        for r in rows:
            vps = "" if r.verify_tokens_per_step is None else f"{r.verify_tokens_per_step:.2f}"
            lines.append(
                f"| {name} | {'tree' if r.tree else 'chain'} | {r.dataset} | {r.temperature:g} | "
                f"{tau_text(r.acceptance_length)} | {vps} | {r.speedup:.2f}x |"
            )
    return "\n".join(lines) + "\n"


def report_dir(spec, out: Path | None) -> Path:
    """Where one draft's eval.json goes: --out, else a plain draft directory itself (what `auto` reads), else
    runs/eval/<label> (a registered name, or a directory with options: its chain's eval.json stays as it was)."""
    if out is not None:
        return out
    if not spec.options and Path(spec.base).is_dir():
        return Path(spec.base)
    safe = "".join(c if c.isalnum() or c in "-_.=,[]" else "_" for c in spec.label)
    return Path("runs") / "eval" / safe


def run_eval_cli(args, parser: argparse.ArgumentParser) -> int:
    import sys

    from deepspec.models import load_target

    if args.threads:
        torch.set_num_threads(args.threads)
    temperatures, datasets = _eval_grid(args, parser)
    try:  # every eval prompt is chat: a target without a template stops here, in one line
        target = load_target(
            args.target,
            dtype=args.dtype,
            device=args.device,
            quantization=args.quantization,
            chat_template=args.chat_template,
            for_chat=True,
        )
        drafters, specs = _eval_drafters(args, parser, target)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    results = evaluate(
        target,
        drafters,
        datasets,
        args.num_prompts,
        args.max_tokens,
        temperatures,
        args.num_speculative_tokens,
        args.batch_size,
        not args.no_check_identical,
        on_result=_show_result,
        verify_budget=not args.verify_all,
    )
    settings = {
        "datasets": datasets,
        "num_prompts": args.num_prompts,
        "max_tokens": args.max_tokens,
        "temperatures": temperatures,
        "num_speculative_tokens": args.num_speculative_tokens,
        "verify_budget": not args.verify_all,
        "batch_size": args.batch_size,
        "dtype": args.dtype,
        "device": args.device,
        "quantization": target.quantization,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "torch": torch.__version__,
    }
    failed = _write_eval_reports(args, target.name, drafters, specs, results, settings)
    table = comparison_table(results)
    if len(drafters) > 1:
        print(table)
    if args.compare is not None:
        args.compare.parent.mkdir(parents=True, exist_ok=True)
        args.compare.write_text(f"# drafts on {target.name}\n\nSettings: {json.dumps(settings)}\n\n{table}")
    return 1 if failed else 0


def _eval_grid(args, parser: argparse.ArgumentParser) -> tuple[list[float], list[str]]:
    """(temperatures, datasets) of the command line, checked with the other sizes (a usage error otherwise)."""
    try:
        temperatures = [float(t) for t in args.temperatures.split(",") if t.strip()]
    except ValueError:
        parser.error(f"--temperatures must be comma-separated numbers, got '{args.temperatures}'")
    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    if not datasets or args.num_prompts < 1 or args.max_tokens < 1:
        parser.error("need at least one dataset, --num-prompts >= 1 and --max-tokens >= 1")
    if args.out is not None and len(args.draft) > 1:
        parser.error("--out takes one draft; with several, each report goes into its draft directory")
    return temperatures, datasets


def _eval_drafters(args, parser: argparse.ArgumentParser, target) -> tuple[dict, dict]:
    """Each `--draft` built on `target` → ({label: drafter}, {label: its spec}); ValueError for a spec that does
    not build (an option the drafter does not take included), a usage error for `none` or a repeat."""
    from training.draft_specs import parse_draft_spec

    drafters, specs = {}, {}
    for text in args.draft:
        spec = parse_draft_spec(text)
        try:
            drafter = spec.build(target)
        except TypeError as exc:  # an option this drafter does not take
            raise ValueError(f"{text}: {exc}") from None
        if drafter is None:
            parser.error("--draft none has nothing to evaluate")
        if spec.label in drafters:
            parser.error(f"--draft {text} is given twice")
        drafters[spec.label], specs[spec.label] = drafter, spec
    return drafters, specs


def _show_result(draft: str, r: EvalResult) -> None:
    """One line per measured (draft, dataset, temperature) on stderr, as they come."""
    import sys

    same = "" if r.identical_to_target is None else f" identical={r.identical_to_target}"
    print(
        f"{Path(draft).name:24s} {r.dataset:10s} T={r.temperature:g} τ={tau_text(r.acceptance_length)} "
        f"verify={r.verify_rate:.2f} {r.tokens_per_second:.1f} vs {r.baseline_tokens_per_second:.1f} tok/s "
        f"→ {r.speedup:.2f}x{same}",
        file=sys.stderr,
        flush=True,
    )


def _write_eval_reports(args, target_name: str, drafters: dict, specs: dict, results: dict, settings: dict) -> bool:
    """Each draft's eval.json / eval.md into its report directory (printed too) → whether a draft's greedy output
    differed from the target's own (said on stderr)."""
    import sys

    failed = False
    for label, drafter in drafters.items():
        spec = specs[label]
        out_dir = report_dir(spec, args.out)
        meta = {
            "target": target_name,
            "draft": label,
            "algo": getattr(drafter, "name", spec.base),
            "options": spec.options,
            "settings": settings,
        }
        write_reports(results[label], out_dir, meta)
        print((out_dir / "eval.md").read_text())
        bad = [r.dataset for r in results[label] if r.identical_to_target is False]
        if bad:
            failed = True
            print(f"error: {label}: greedy output differs from target-only on {bad}", file=sys.stderr)
    return failed
