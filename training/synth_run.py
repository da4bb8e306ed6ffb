"""`python -m training synth`: synthesize user turns with the target, then have it answer them, in rounds.

One process loads the target once and alternates: synthesize up to `--chunk` more prompts (synth.py), then answer
every prompt not answered yet (prepare.stream_regenerate) — the synthetic ones and, interleaved with them, the
shipped train prompts given with `--mix`. A run stopped at any point leaves usable conversations, and `--resume`
continues both files. The held-out prompts are never answered here (prepare leaves them out); they are for the
team's evaluation.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from deepspec.models.backends import AUTO, ONNX, backend_choices
from training.heldout import SYNTH_SOURCE_PREFIX

#: the backends a regeneration runs on: the PyTorch decoder and the native one (no ONNX export in training)
TRAINING_BACKENDS = backend_choices(without=(ONNX,))


def add_synth_parser(sub, add_chat_template) -> None:
    from training.synth import SEEDINGS

    p = sub.add_parser(
        "synth",
        help="Magpie-style user turns written by the target, then its answers to them",
        description="Samples user turns from the target's own chat template (the user prefix), "
        "filters and deduplicates them, keeps a held-out split (<out>.heldout.jsonl, never trained "
        "on), and with --answers regenerates the target's answers to them (and to --mix prompt "
        "files) on the fastest engine backend, in rounds of --chunk prompts.",
    )
    p.add_argument("--out", required=True, type=Path, help="synthetic prompts jsonl (training split)")
    p.add_argument("--num-prompts", type=int, required=True, help="kept prompts to reach (training + held out)")
    p.add_argument(
        "--answers",
        type=Path,
        default=None,
        help="conversations jsonl to write the answers to (.jsonl or .jsonl.gz: appended while running)",
    )
    p.add_argument(
        "--mix",
        nargs="*",
        type=Path,
        default=[],
        help="prompt files answered alongside (e.g. datasets/train/*.jsonl.gz); never the eval sets",
    )
    p.add_argument("--mix-limit-per-file", type=int, default=None, help="rows drawn per --mix file (default all)")
    p.add_argument(
        "--chunk",
        type=int,
        default=500,
        help="prompts synthesized per round before answering them "
        "(default 500: a stopped run has answers to most of its prompts)",
    )
    p.add_argument(
        "--resume", action="store_true", help="continue the files of an earlier run (else they must not exist)"
    )
    p.add_argument(
        "--seeding",
        choices=SEEDINGS,
        default="mixed",
        help="system prompts: default = the template's own, topics = 'You are a helpful assistant for "
        "<topic>' over a topic list, mixed (default) = both in turn",
    )
    p.add_argument("--temperature", type=float, default=1.0, help="user-turn sampling temperature (default 1)")
    p.add_argument("--top-p", type=float, default=0.95, help="user-turn nucleus mass (default 0.95)")
    p.add_argument("--max-user-tokens", type=int, default=192, help="user turns cut off here are rejected")
    p.add_argument("--max-tokens", type=int, default=384, help="answer tokens at most (default 384)")
    p.add_argument("--answer-temperature", type=float, default=0.0, help="0 = greedy answers (default)")
    p.add_argument(
        "--near-duplicate-threshold",
        type=float,
        default=0.7,
        help="MinHash Jaccard above which a turn is a near duplicate (default 0.7)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8, help="engine rows (default 8)")
    p.add_argument("--max-seq-len", type=int, default=1024, help="answer slots' context: prompt + answer")
    p.add_argument("--target", default="smollm2-135m", help="target alias, .gguf or HF directory")
    p.add_argument(
        "--backend",
        choices=TRAINING_BACKENDS,
        default=AUTO,
        help="auto (default) = the native CPU decoder where it builds, else PyTorch",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="native decoder threads (default: one per core); 1 suits a nice -n 19 run on a busy machine",
    )
    p.add_argument("--dtype", default="float32", help="pytorch backend dtype")
    add_chat_template(p)


def _check(args, parser) -> None:
    from training.synth import SynthFiles

    if (
        args.num_prompts < 1
        or args.chunk < 1
        or args.batch_size < 1
        or args.max_tokens < 1
        or (args.threads is not None and args.threads < 1)
    ):
        parser.error("--num-prompts, --chunk, --batch-size, --max-tokens and --threads must be >= 1")
    if not 0 < args.top_p <= 1 or args.temperature <= 0:
        parser.error("user turns are sampled: need --temperature > 0 and 0 < --top-p <= 1")
    if args.max_seq_len <= args.max_tokens:
        parser.error("--max-seq-len must exceed --max-tokens (it holds the prompt and the answer)")
    existing = SynthFiles(args.out).existing() + ([args.answers] if args.answers and args.answers.is_file() else [])
    if existing and not args.resume:
        parser.error(f"{existing[0]} exists: pass --resume to continue it, or choose another --out")


def run_synth_cli(args, parser) -> int:
    from deepspec.models.native import NativeUnavailable
    from training.prepare import load_engine_target

    _check(args, parser)
    _mend_torn_files(args)
    try:
        target, backend = load_engine_target(
            args.target, args.backend, dtype=args.dtype, chat_template=args.chat_template, num_threads=args.threads
        )
    except (ValueError, NativeUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"synthesizing with {backend}, batch {args.batch_size} → {args.out}", file=sys.stderr)
    totals = {
        "synth_tokens": 0,
        "synth_seconds": 0.0,
        "synth_cpu_seconds": 0.0,
        "answer_tokens": 0,
        "answer_seconds": 0.0,
        "answer_cpu_seconds": 0.0,
        "answered": 0,
        "failed": 0,
    }
    goal = _kept_so_far(args.out)  # a resumed run's rounds start from what it holds
    if goal >= args.num_prompts and args.answers is not None:
        _answer_round(target, args, totals, final=True)
    while goal < args.num_prompts:
        goal = min(args.num_prompts, goal + args.chunk)
        state = _synth_round(target, args, goal, totals)
        if args.answers is not None:
            _answer_round(target, args, totals, final=goal >= args.num_prompts)
        if state.accepted + state.heldout < goal:  # the attempt cap stopped it: more rounds would change nothing
            print(
                f"stopped at {state.accepted + state.heldout} kept prompts after {state.attempts} attempts",
                file=sys.stderr,
            )
            break
    from training.synth import SynthFiles, synth_report

    summary = {
        "backend": backend,
        **synth_report(SynthFiles(args.out)),
        **totals,
        "synth_tokens_per_second": round(totals["synth_tokens"] / max(totals["synth_seconds"], 1e-9), 1),
        "answer_tokens_per_second": round(totals["answer_tokens"] / max(totals["answer_seconds"], 1e-9), 1),
        # on a shared machine wall time measures the neighbours too; tokens per CPU-second (all threads of
        # this process) times the cores it may use bounds what it does alone
        "synth_tokens_per_cpu_second": round(totals["synth_tokens"] / max(totals["synth_cpu_seconds"], 1e-9), 1),
        "answer_tokens_per_cpu_second": round(totals["answer_tokens"] / max(totals["answer_cpu_seconds"], 1e-9), 1),
    }
    print(json.dumps(summary))
    return 0


def _mend_torn_files(args) -> None:
    """.jsonl.gz outputs a killed run left cut short (training.data.recover_torn_gzip), mended before anything reads
    them: the tracked synthetic data (training/data/synth) is written compressed and appended to across runs."""
    from training.data import recover_torn_gzip
    from training.synth import SynthFiles

    files = SynthFiles(args.out)
    for path in (files.prompts, files.heldout, files.rejected, args.answers):
        if path is not None:
            recover_torn_gzip(path)


def _kept_so_far(out: Path) -> int:
    """Kept prompts (training and held out) the files of --out hold."""
    from training.data import read_jsonl_lines
    from training.synth import SynthFiles

    files = SynthFiles(out)
    return sum(
        1
        for path in (files.prompts, files.heldout)
        if path.is_file()
        for line in read_jsonl_lines(path)
        if line.strip()
    )


def _synth_round(target, args, goal: int, totals: dict):
    from training.progress import Progress
    from training.synth import SynthFiles, SynthSettings, synthesize

    settings = SynthSettings(
        num_prompts=goal,
        seeding=args.seeding,
        max_tokens=args.max_user_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        batch_size=args.batch_size,
        near_duplicate_threshold=args.near_duplicate_threshold,
    )
    files = SynthFiles(args.out)
    started, cpu_started = time.perf_counter(), time.process_time()
    with Progress(goal, "synth") as progress:
        progress.resume_from(_kept_so_far(args.out))

        def on_result(state, tokens: int) -> None:
            progress.advance(
                state.accepted + state.heldout - progress.done, tokens=tokens, rejected=sum(state.rejected.values())
            )

        state = synthesize(target, files, settings, on_result=on_result)
    totals["synth_seconds"] += time.perf_counter() - started
    totals["synth_cpu_seconds"] += time.process_time() - cpu_started
    totals["synth_tokens"] += progress.tokens
    return state


def _answer_round(target, args, totals: dict, final: bool) -> None:
    """Answer the prompts synthesized so far, with the --mix rows interleaved up to the last synthetic one (all of
    them in the final round)."""
    from deepspec.decoding.params import SamplingParams
    from training.prepare import PrepareStats, finished_ids, read_prompts, stream_regenerate
    from training.progress import Progress

    stats = PrepareStats()
    limits: list[int | None] = [None, *[args.mix_limit_per_file] * len(args.mix)]  # the limit is the mix's
    rows = read_prompts([args.out, *args.mix], limits, args.seed, stats)
    if not final:
        synthetic = [i for i, r in enumerate(rows) if r.source.startswith(SYNTH_SOURCE_PREFIX)]
        rows = rows[: synthetic[-1] + 1] if synthetic else []
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.answer_temperature, seed=args.seed)
    started, cpu_started = time.perf_counter(), time.process_time()
    with Progress(len(rows), "answer") as progress:
        progress.resume_from(len({r.id for r in rows} & finished_ids(args.answers)))
        stream_regenerate(
            rows,
            target,
            params,
            args.answers,
            stats,
            batch_size=args.batch_size,
            max_seq_len=args.max_seq_len,
            on_row=lambda tok: progress.advance(1, tokens=tok, failed=stats.num_failed),
        )
    totals["answer_seconds"] += time.perf_counter() - started
    totals["answer_cpu_seconds"] += time.process_time() - cpu_started
    totals["answer_tokens"] += stats.num_tokens
    totals["answered"] += stats.num_done
    totals["failed"] += stats.num_failed
