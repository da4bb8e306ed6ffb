"""τ against tokens seen for a long training run (`python -m training curve`).

Why: the shipped neural drafts stopped after under an hour, underfit. Whether more training would carry one past
corpus lookup is a question about the slope of τ in the tokens the draft has seen, so a long run is measured while
it trains: the newest checkpoint is decoded by the engine on a small fixed prompt subset (greedy, γ = 7, batch 1),
and τ is read at engine round starts — the training log's τ at random anchors overstates it by ~0.5. Each
measurement appends (step, tokens seen, τ per eval set) to a JSON record that lives in the repo, so the curve grows
across sessions with `train --resume`.

The extrapolation fits τ = a + b·log10(tokens) to the mean τ over the eval sets by least squares and solves for the
tokens at which the fit reaches a goal τ (corpus lookup's). Its uncertainty comes from the slope's standard error:
the goal is solved again at b ± one standard error (a moved so the line still passes through the data's centroid).
A handful of noisy points makes that interval wide; it is reported, not hidden.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

#: the fixed subset every curve point is measured on (the shipped drafts' evals used the same prompts and lengths)
DEFAULT_DATASETS = ("humaneval", "gsm8k", "mbpp")
DEFAULT_NUM_PROMPTS = 4
DEFAULT_MAX_TOKENS = 128
DEFAULT_GAMMA = 7


def checkpoint_step(ckpt: Path) -> int:
    """checkpoints/step_0000125 → 125."""
    name = Path(ckpt).name
    if not name.startswith("step_") or not name[5:].isdigit():
        raise ValueError(f"{ckpt} is not a step_N checkpoint directory")
    return int(name[5:])


def tokens_at_step(run_dir: Path, step: int) -> int:
    """Tokens the run had read after `step` optimizer steps, from its train_log.jsonl (cheap: the trainer state
    holds the same number but also the optimizer moments)."""
    log = Path(run_dir) / "train_log.jsonl"
    if log.is_file():
        with log.open() as f:
            for line in f:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line being written right now
                if row.get("step") == step:
                    return int(row["tokens"])
    import torch

    state = torch.load(
        Path(run_dir) / "checkpoints" / f"step_{step:07d}" / "trainer_state.pt", weights_only=False, map_location="cpu"
    )
    return int(state["tokens_seen"])


def newest_checkpoint(run_dir: Path) -> Path | None:
    from training.trainer import latest_checkpoint

    return latest_checkpoint(Path(run_dir))


def measure_tau(
    target,
    drafter,
    datasets=DEFAULT_DATASETS,
    num_prompts: int = DEFAULT_NUM_PROMPTS,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    gamma: int = DEFAULT_GAMMA,
) -> dict[str, float | None]:
    """Greedy engine τ of `drafter` per eval set (accepted drafts + 1 per round that verified drafts, as `eval`
    counts it); None for a set where no round verified drafts. No target-only baseline: the curve needs τ only, and
    the baseline would double the cost. Neither the verify budget nor the draft's own forward is priced
    (the engine's default planner, no budget): τ is the draft's quality, so every round verifies the whole chain,
    whatever this machine's step times (under load, the budget had cut a weak early checkpoint's every round, leaving
    no τ)."""
    from deepspec.decoding.engine import SpecEngine
    from deepspec.decoding.params import SamplingParams
    from training.evaluate import load_eval_prompts, summarize

    engine = SpecEngine(target, drafter, max_batch_size=1, max_seq_len=2048, num_speculative_tokens=gamma)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, seed=0)
    out = {}
    for name in datasets:
        prompts = [target.encode_chat([{"role": "user", "content": p}]) for p in load_eval_prompts(name, num_prompts)]
        results = [engine.generate([p], params)[0] for p in prompts]
        tau = summarize(results)[0]
        out[name] = None if tau is None else round(tau, 4)
    return out


@dataclass
class Record:
    """The JSON file of one run's curve: settings once, then one point per measured checkpoint."""

    path: Path

    def load(self) -> dict:
        if self.path.is_file():
            return json.loads(self.path.read_text())
        return {"points": []}

    def steps(self) -> set[int]:
        return {p["step"] for p in self.load()["points"]}

    def add(self, point: dict, meta: dict) -> dict:
        """Append `point` (replacing one at the same step), sorted by tokens; `meta` fills missing settings."""
        data = self.load()
        for key, value in meta.items():
            data.setdefault(key, value)
        data["points"] = sorted(
            [p for p in data["points"] if p["step"] != point["step"]] + [point], key=lambda p: p["tokens_seen"]
        )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(self.path)
        return data


def mean_tau(point: dict) -> float | None:
    """The point's τ averaged over its eval sets; None when a set has no τ (no round drafted there): a mean over
    fewer sets would not compare with the other points."""
    taus = list(point["tau"].values())
    return None if None in taus else sum(taus) / len(taus)


def tau_series(points: list[dict]) -> tuple[list[float], list[float]]:
    """(tokens seen, mean τ) of the points a fit can use, those with a mean τ: what a fit or a plot of the mean
    takes."""
    tokens, taus = [], []
    for point in points:
        tau = mean_tau(point)
        if tau is not None:
            tokens.append(point["tokens_seen"])
            taus.append(tau)
    return tokens, taus


@dataclass
class LogFit:
    """τ ≈ a + b·log10(tokens) by least squares; slope_se is the slope's standard error (nan under 3 points)."""

    a: float
    b: float
    slope_se: float
    num_points: int
    x_mean: float

    def tau_at(self, tokens: float) -> float:
        return self.a + self.b * math.log10(tokens)

    def tokens_for(self, goal: float, slope: float | None = None) -> float:
        """Tokens at which the line (with `slope`, pivoting on the data's centroid) reaches `goal`; inf when it
        never does (flat or falling)."""
        b = self.b if slope is None else slope
        if b <= 0:
            return math.inf
        y_mean = self.a + self.b * self.x_mean
        return 10 ** (self.x_mean + (goal - y_mean) / b)

    def tokens_interval(self, goal: float) -> tuple[float, float]:
        """(optimistic, pessimistic) tokens to reach `goal` at slope b ± one standard error."""
        if not math.isfinite(self.slope_se):
            return math.nan, math.nan
        return self.tokens_for(goal, self.b + self.slope_se), self.tokens_for(goal, self.b - self.slope_se)


def fit_log_tokens(tokens: list[float], taus: list[float]) -> LogFit:
    """Least squares of τ on log10(tokens); needs 2+ points at distinct token counts."""
    if len(tokens) != len(taus) or len(tokens) < 2:
        raise ValueError(f"need at least 2 (tokens, τ) points to fit, got {len(tokens)}")
    if any(t <= 0 for t in tokens):
        raise ValueError("tokens must be positive to take their log")
    xs = [math.log10(t) for t in tokens]
    n = len(xs)
    x_mean, y_mean = sum(xs) / n, sum(taus) / n
    sxx = sum((x - x_mean) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("all points are at the same token count; nothing to fit a slope to")
    b = sum((x - x_mean) * (y - y_mean) for x, y in zip(xs, taus)) / sxx
    a = y_mean - b * x_mean
    if n > 2:
        residual = sum((y - (a + b * x)) ** 2 for x, y in zip(xs, taus))
        se = math.sqrt(residual / (n - 2) / sxx)
    else:
        se = math.nan
    return LogFit(a, b, se, n, x_mean)


def plot_curve(
    data: dict, out_png: Path, references: dict[str, dict] | None = None, goal: dict[str, float] | None = None
) -> None:
    """τ per eval set against tokens seen (log x), the shipped drafts as labelled points at the tokens they saw
    (`references`: name → {"tokens_seen", "tau": {set: τ}}), the corpus lookup's τ per set as dashed lines to beat
    (`goal`: set → τ), and the log fit of the mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = data["points"]
    sets = list(points[0]["tau"]) if points else list(goal or {})
    colors: dict[str, str] = dict(zip(sets, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")))
    fig, ax = plt.subplots(figsize=(9, 5))
    _plot_sets(ax, points, sets, colors, goal)
    goal_mean = sum(goal.values()) / len(goal) if goal else None
    _plot_history(ax, data.get("history", {}), goal_mean)
    if goal_mean is not None:
        ax.axhline(
            goal_mean,
            color="black",
            linestyle="--",
            linewidth=0.8,
            alpha=0.5,
            label=f"corpus lookup, mean τ {goal_mean:.2f}",
        )
    for name, ref in (references or {}).items():
        for s, tau in ref["tau"].items():
            ax.scatter([ref["tokens_seen"]], [tau], marker="x", color=colors.get(s, "black"))
        ax.annotate(
            name, (ref["tokens_seen"], max(ref["tau"].values())), fontsize=7, xytext=(3, 3), textcoords="offset points"
        )
    ax.set_xscale("log")
    ax.set_xlabel("tokens seen in training")
    ax.set_ylabel("greedy engine τ (round starts)")
    ax.grid(alpha=0.3, which="both")
    ax.set_title(f"{data.get('draft', 'draft')}: τ vs tokens (dashed: corpus lookup, x: shipped drafts)", fontsize=9)
    ax.legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    Path(out_png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=100)
    plt.close(fig)


def _plot_sets(ax, points: list[dict], sets: list[str], colors: dict[str, str], goal: dict[str, float] | None) -> None:
    """This run's τ per eval set (a set without τ at a point leaves a gap), each set's corpus-lookup τ as a dashed
    line, and the log fit of the mean carried 30x past the last point."""
    xs = [p["tokens_seen"] for p in points]
    for name in sets:
        ax.plot(
            xs,
            [math.nan if p["tau"][name] is None else p["tau"][name] for p in points],
            marker="o",
            color=colors.get(name),
            label=f"{name}",
        )
        if goal and name in goal:
            ax.axhline(goal[name], color=colors.get(name), linestyle="--", linewidth=1)
    fit_xs, fit_taus = tau_series(points)
    if len(set(fit_xs)) >= 2:
        fit = fit_log_tokens(fit_xs, fit_taus)
        hi = max(xs) * 30
        grid = [min(xs) * (hi / min(xs)) ** (i / 40) for i in range(41)]
        ax.plot(
            grid,
            [fit.tau_at(x) for x in grid],
            color="gray",
            linestyle=":",
            label=f"fit of the mean: τ = {fit.a:.2f} + {fit.b:.2f}·log10(tokens)",
        )


def _plot_history(ax, history: dict, goal_mean: float | None) -> None:
    """Earlier drafts measured at 2+ training lengths: their mean τ, and each one's log-line carried on to the
    corpus lookup's mean τ."""
    markers = iter("sD^v<>")
    for name, series in history.items():
        hx, mean = tau_series(series["points"])
        ax.plot(
            hx,
            mean,
            marker=next(markers, "s"),
            color="black",
            linestyle="-.",
            linewidth=1,
            alpha=0.6,
            label=f"{name} (mean τ)",
        )
        if goal_mean is not None and len(set(hx)) >= 2:
            fit = fit_log_tokens(hx, mean)
            end = min(fit.tokens_for(goal_mean), 1e10)
            if end > max(hx):
                ax.plot(
                    [max(hx), end],
                    [fit.tau_at(max(hx)), fit.tau_at(end)],
                    color="black",
                    linestyle=":",
                    linewidth=0.8,
                    alpha=0.5,
                )


def measure_newest(
    run_dir: Path,
    record: Record,
    target,
    threads: int | None,
    log,
    datasets=DEFAULT_DATASETS,
    num_prompts: int = DEFAULT_NUM_PROMPTS,
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> dict | None:
    """Measure the run's newest checkpoint unless the record already has its step; returns the point or None."""
    from deepspec.decoding.registry import build_drafter

    ckpt = newest_checkpoint(run_dir)
    if ckpt is None:
        log(f"no checkpoint under {run_dir}/checkpoints yet")
        return None
    step = checkpoint_step(ckpt)
    if step in record.steps():
        return None
    tokens = tokens_at_step(run_dir, step)
    drafter = build_drafter(str(ckpt), target)  # loads the weights now: rotation may delete the folder later
    start = time.perf_counter()
    tau = measure_tau(target, drafter, datasets, num_prompts, max_tokens)
    point = {
        "step": step,
        "tokens_seen": tokens,
        "tau": tau,
        "seconds": round(time.perf_counter() - start, 1),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    meta = {
        "run": str(run_dir),
        "draft": Path(run_dir).name,
        "settings": {
            "datasets": list(datasets),
            "num_prompts": num_prompts,
            "max_tokens": max_tokens,
            "num_speculative_tokens": DEFAULT_GAMMA,
            "temperature": 0.0,
            "batch_size": 1,
            "dtype": str(target.dtype).replace("torch.", ""),
            "threads": threads,
        },
    }
    record.add(point, meta)
    log(f"step {step}: {tokens:,} tokens, τ {tau}")
    return point


def greedy_tau(draft_dir: Path, datasets=DEFAULT_DATASETS) -> dict[str, float]:
    """A shipped draft's greedy τ per eval set, from its eval.json (a set where no round drafted has none)."""
    path = Path(draft_dir) / "eval.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run `python -m training eval --draft {draft_dir}` first")
    results = json.loads(path.read_text())["results"]
    tau = {
        r["dataset"]: r["acceptance_length"]
        for r in results
        if r["temperature"] == 0 and r["dataset"] in datasets and r["acceptance_length"] is not None
    }
    if not tau:
        raise ValueError(f"{path} has no greedy result on {list(datasets)}")
    return tau


def parse_reference(spec: str, datasets=DEFAULT_DATASETS) -> tuple[str, dict]:
    """'drafts/x=451000' → ('x', {"tokens_seen": 451000, "tau": {...}})."""
    path, sep, tokens = spec.rpartition("=")
    if not sep or not tokens.isdigit() or int(tokens) <= 0:
        raise ValueError(f"--references takes DIR=TOKENS (a positive integer), got '{spec}'")
    return Path(path).name, {"tokens_seen": int(tokens), "tau": greedy_tau(Path(path), datasets)}


def summarize_fit(data: dict, goal_tau: dict[str, float] | None) -> dict | None:
    """The log fit of the record's mean τ and, with a goal, the tokens it would take to reach the goal's mean;
    under "history", the same for each earlier draft series the record holds."""
    out = _fit_points(data["points"], goal_tau)
    history = {name: _fit_points(series["points"], goal_tau) for name, series in data.get("history", {}).items()}
    history = {k: v for k, v in history.items() if v is not None}
    if out is None and not history:
        return None
    return {**(out or {}), **({"history": history} if history else {})}


def _fit_points(points: list[dict], goal_tau: dict[str, float] | None) -> dict | None:
    xs, taus = tau_series(points)
    if len(xs) < 2 or len(set(xs)) < 2:
        return None
    fit = fit_log_tokens(xs, taus)
    out = {
        "a": round(fit.a, 4),
        "b_per_decade": round(fit.b, 4),
        "b_standard_error": None if math.isnan(fit.slope_se) else round(fit.slope_se, 4),
        "num_points": fit.num_points,
    }
    if goal_tau:
        goal = sum(goal_tau.values()) / len(goal_tau)
        lo, hi = fit.tokens_interval(goal)
        out.update(
            goal_mean_tau=round(goal, 4),
            tokens_to_goal=_finite(fit.tokens_for(goal)),
            tokens_to_goal_at_slope_plus_se=_finite(lo),
            tokens_to_goal_at_slope_minus_se=_finite(hi),
        )
    return out


def _finite(x: float) -> float | None:
    return float(f"{x:.3g}") if math.isfinite(x) else None


def run_curve_cli(args, parser) -> int:
    import sys

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    datasets = tuple(d.strip() for d in args.datasets.split(",") if d.strip())
    if not datasets or args.num_prompts < 1 or args.max_tokens < 1:
        parser.error("need at least one dataset, --num-prompts >= 1 and --max-tokens >= 1")
    try:
        references = dict(parse_reference(s, datasets) for s in args.references)
        goal = greedy_tau(args.goal, datasets) if args.goal else None
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.every_minutes is not None and args.every_minutes <= 0:
        parser.error("--every-minutes must be > 0")
    record = Record(args.record)
    if args.run is not None:
        if not args.run.is_dir():
            print(f"error: run directory {args.run} not found", file=sys.stderr)
            return 2
        import torch

        from deepspec.models import load_target

        if args.threads:
            torch.set_num_threads(args.threads)
        try:  # every curve prompt is chat: a target without a template stops here, not once per round
            target = load_target(args.target, chat_template=args.chat_template, for_chat=True)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        started = time.time()
        while True:
            summary = args.run / "train_summary.json"
            finished = summary.is_file() and summary.stat().st_mtime > started
            try:
                measure_newest(
                    args.run, record, target, torch.get_num_threads(), log, datasets, args.num_prompts, args.max_tokens
                )
            except (OSError, RuntimeError, ValueError) as exc:  # a checkpoint rotated away mid-load: next round
                log(f"measurement failed, retrying next round: {exc}")
            if args.every_minutes is None or finished:
                break
            time.sleep(args.every_minutes * 60)
    data = record.load()
    if args.plot is not None:
        if not data["points"] and not goal:
            print(f"error: {args.record} has no points to plot", file=sys.stderr)
            return 2
        plot_curve(data, args.plot, references, goal)
    fit = summarize_fit(data, goal)
    if fit is not None:
        data = record.load()
        data["fit"] = fit
        if references:
            data["references"] = references
        if goal:
            data["goal"] = {"draft": Path(args.goal).name, "tau": goal}
        args.record.write_text(json.dumps(data, indent=2) + "\n")
    print(markdown_table(data))
    print(json.dumps({"points": len(data["points"]), "fit": fit}))
    return 0


def markdown_table(data: dict) -> str:
    """The record's points as the table drafts/README.md shows: step, tokens seen, τ per set and their mean."""
    from training.evaluate import tau_text

    points = data["points"]
    sets = list(points[0]["tau"]) if points else []
    lines = [
        "| step | tokens seen | " + " | ".join(f"τ {s}" for s in sets) + " | mean τ |",
        "| --- | --- | " + " | ".join("---" for _ in sets) + " | --- |",
    ]
    for p in points:
        lines.append(
            f"| {p['step']} | {p['tokens_seen']:,} | "
            + " | ".join(tau_text(p["tau"][s]) for s in sets)
            + f" | {tau_text(mean_tau(p))} |"
        )
    return "\n".join(lines)
