"""`python -m training prepare|synth|card|train|corpus|store|eval|curve` — data regeneration, synthetic chat made
by the target itself and its data card, draft training, the corpus-lookup index, draft weight storage (int8),
acceptance/speedup evaluation.

This file only parses arguments and runs the stage; the work lives in prepare.py, trainer.py, corpus.py,
evaluate.py.

Runbook (default target SmolLM2-135M-Instruct, CPU):

    # 1. regenerate answers with the target (our engine; or --endpoint http://127.0.0.1:8081 for llama.cpp/vLLM)
    python -m training prepare --inputs datasets/train/gsm8k_train.jsonl.gz \\
        datasets/train/codealpaca.jsonl.gz --limit-per-file 300 --out training/data/smollm2-regen.jsonl
    # 2. train (online target features; tiny CPU run shown — see training/configs/ for the shipped recipes)
    python -m training train --algo eagle3 --data training/data/smollm2-regen.jsonl --out runs/eagle3 \\
        optim.max_steps=200
    python -m training train -c training/configs/smollm2-135m-dspark-offline.yaml --resume
    # 2a. or distil from the target over any text: no prepare step (features + soft labels in one prefill)
    python -m training train --algo eagle3 --labels target --data datasets/train/gsm8k_train.jsonl.gz \
        --out runs/eagle3-distill optim.max_steps=200
    torchrun --nproc-per-node 2 -m training train --algo dflash ... dist.backend=gloo
    # the Eagle3 layout SGLang / vLLM / TensorRT-LLM load (then python -m export)
    python -m training train -c training/configs/smollm2-135m-eagle3-canonical.yaml
    # 2b. or index the answers for corpus lookup (no training step; drafts what the target wrote elsewhere)
    python -m training corpus --data training/data/smollm2-regen.jsonl --out runs/corpus
    # 2c. store the shipped weights in 4-bit blocks (q4, ~a sixth of float32) or int8 (a quarter); re-measure after
    python -m training store --draft runs/eagle3 --storage-dtype q4
    # 3. evaluate: τ, verify rate, per-position survival, speedup vs target-only; eval.json + eval.md + PNG
    python -m training eval --draft drafts/smollm2-135m-eagle3 --datasets humaneval,gsm8k,mbpp --num-prompts 10
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from deepspec.models.backends import AUTO
from deepspec.models.quantization import QUANTIZATIONS
from training.card import add_card_parser
from training.synth_run import TRAINING_BACKENDS, add_synth_parser


def _add_chat_template(p) -> None:
    """`--chat-template`, the same option as the worker's: what every subcommand that renders chat takes."""
    from deepspec.models.chat_templates import BUILTIN_CHAT_TEMPLATES  # no heavy imports: --help stays fast

    p.add_argument(
        "--chat-template",
        default=None,
        metavar="NAME|FILE",
        help=f"chat template for a target that ships none (gemma3-270m): a built-in "
        f"({', '.join(BUILTIN_CHAT_TEMPLATES)}) or a Jinja file (default: the tokenizer's own)",
    )


def _add_prepare(sub) -> None:
    p = sub.add_parser(
        "prepare",
        help="regenerate assistant turns with the target (engine or OpenAI endpoint)",
        description='Prompts jsonl ({"turns": [...]}) → conversations answered by the target. '
        "Resumable: re-running skips rows already in --out; failures go to <out>.failures.jsonl.",
    )
    p.add_argument(
        "--inputs",
        nargs="+",
        required=True,
        type=Path,
        help="prompt files, one JSON object per line with a 'turns' list of user messages "
        "(e.g. datasets/train/gsm8k_train.jsonl.gz); never the eval sets",
    )
    p.add_argument("--out", required=True, type=Path, help="output jsonl (appended to; rows keyed by file:line)")
    p.add_argument(
        "--limit-per-file",
        type=int,
        default=None,
        help="rows drawn at random per input file (default: all; 300 ≈ 10 min on llama.cpp CPU)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the row draw and of sampling (default 0)")
    p.add_argument(
        "--max-tokens",
        type=int,
        default=384,
        help="max generated tokens per assistant turn (default 384; gsm8k answers ≈ 150-250)",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0 = greedy (default; what a greedy-serving draft should match), 0.7-1.0 for diversity",
    )
    p.add_argument(
        "--target",
        default="smollm2-135m",
        help="target alias, .gguf file or HF directory (default smollm2-135m); used by the engine "
        "backend and always for the tokenizer-independent row ids",
    )
    p.add_argument(
        "--backend",
        choices=TRAINING_BACKENDS,
        default=AUTO,
        help="engine backend: native = the native CPU decoder (the fastest on CPU: the default target's "
        "own 4-bit weights), pytorch = the PyTorch target in --dtype; auto (default) = native where "
        "it builds (CPU + C compiler), else pytorch",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="native decoder threads (default: one per core); 1 suits a nice -n 19 run on a busy machine",
    )
    p.add_argument("--dtype", default="float32", help="target dtype of the pytorch backend (float32|bfloat16)")
    p.add_argument("--device", default="cpu", help="engine backend device (cpu, cuda)")
    _add_chat_template(p)
    p.add_argument(
        "--batch-size",
        type=int,
        default=8,
        help="rows per batch: engine slots, or concurrent requests to --endpoint (default 8)",
    )
    p.add_argument(
        "--max-seq-len",
        type=int,
        default=2048,
        help="engine backend: tokens of context per slot, prompt and answer together (default 2048; "
        "sizes the KV cache, longer conversations are logged as failures)",
    )
    p.add_argument(
        "--endpoint",
        default=None,
        help="OpenAI-compatible server base URL (e.g. http://127.0.0.1:8081); default: our own engine",
    )
    p.add_argument("--model", default="default", help="model name sent to --endpoint (default 'default')")


def _add_train(sub) -> None:
    from deepspec.algorithms import available_algorithms  # import paths only, no torch: --help stays fast
    from training.config import describe_config  # pydantic only

    p = sub.add_parser(
        "train",
        help=f"train a {' | '.join(available_algorithms())} draft against a target",
        description="Train a draft. Settings come from defaults < -c config file(s) < flags < "
        "dotted overrides (e.g. optim.lr=3e-4 model.num_layers=2), all validated by one schema "
        "(training/config.py; unknown keys are errors). Prints the resolved config first.",
        epilog=describe_config(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "-c",
        "--config",
        action="append",
        type=Path,
        default=[],
        help="YAML or JSON config file; may repeat (later files win)",
    )
    p.add_argument("--algo", choices=available_algorithms(), help="draft algorithm (model.algo)")
    p.add_argument("--target", help="target alias, .gguf or HF directory (target.name; default smollm2-135m)")
    _add_chat_template(p)
    p.add_argument(
        "--data",
        nargs="+",
        type=Path,
        help="regenerated conversations jsonl (data.paths); with --labels target any text rows too, "
        "e.g. datasets/train/gsm8k_train.jsonl.gz",
    )
    p.add_argument(
        "--labels",
        choices=["regen", "target"],
        default=None,
        help="data.labels: regen (default) = learn the answers `prepare` had the target write; target = "
        "distil the target's own next-token distribution over any text (one prefill gives "
        "features and top-k soft labels; KL per draft slot; no regeneration)",
    )
    p.add_argument("--out", type=Path, help="output directory: checkpoints + final draft (output_dir)")
    _add_train_cache(p)
    p.add_argument(
        "--init-from",
        type=Path,
        default=None,
        help="fine-tune this draft checkpoint (init_from) instead of starting from random weights: "
        "more data for a shipped draft without training it again from scratch",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the latest checkpoint in --out bit-for-bit (optimizer, scheduler, RNG, data position)",
    )
    p.add_argument("--plan", action="store_true", help="print the resolved config and sizes, train nothing")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="dotted overrides, e.g. optim.max_steps=500 optim.lr=5e-4 data.max_len=512 "
        "model.draft_vocab_size=8192 precision=bf16",
    )


def _add_train_cache(p) -> None:
    """train's offline-cache and CPU options: where the target's features are kept, who writes them, and threads."""
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="offline mode: cache only the needed target hidden states here (size printed first); "
        "default: online features (the frozen target runs inside the loop, nothing on disk)",
    )
    p.add_argument(
        "--features-from",
        choices=["target", "native"],
        default=None,
        help="features_from: what computes the target's features, online or into the offline cache (--cache-dir): "
        "the training target (default) or the native CPU decoder on the target's served weights (--labels regen; "
        "several times faster on a CPU; online, no cache to write before the first step)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: torch's choice, one per core); 1 on a machine another job keeps busy, "
        "where threads that wait on each other for a parked core run slower than one thread alone",
    )


def _add_corpus(sub) -> None:
    p = sub.add_parser(
        "corpus",
        help="index the target's regenerated answers for the corpus-lookup drafter",
        description="Builds a corpus-lookup draft directory (config.json + corpus.safetensors): a "
        "suffix index over the assistant turns of regenerated conversations. The engine drafts "
        "from it what the target wrote after the same words elsewhere, after prompt lookup. "
        "Evaluate it like any draft: python -m training eval --draft OUT.",
    )
    p.add_argument(
        "--data",
        nargs="+",
        required=True,
        type=Path,
        help="regenerated conversations jsonl (`python -m training prepare`); never the eval sets",
    )
    p.add_argument("--out", required=True, type=Path, help="draft directory to write (e.g. drafts/smollm2-135m-corpus)")
    p.add_argument(
        "--target",
        default="smollm2-135m",
        help="target alias, .gguf or HF directory whose tokenizer and fingerprint the index takes",
    )
    _add_chat_template(p)
    p.add_argument(
        "--max-match",
        type=int,
        default=12,
        help="longest context suffix matched against the corpus, in tokens (default 12)",
    )
    p.add_argument(
        "--min-match",
        type=int,
        default=1,
        help="shortest suffix match the drafter drafts from (default 1; 2 drafts less but more "
        "precisely, which pays where verifying is expensive, e.g. large batches)",
    )


def _run_corpus(args, parser) -> int:
    from deepspec.models import load_target
    from training.corpus import build_corpus

    if not 1 <= args.min_match <= args.max_match:
        parser.error("need 1 <= --min-match <= --max-match")
    try:
        target = load_target(args.target, chat_template=args.chat_template)
        summary = build_corpus(
            args.data,
            target,
            args.out,
            max_match=args.max_match,
            min_match=args.min_match,
            log=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


def _add_relayout(sub) -> None:
    p = sub.add_parser(
        "relayout",
        help="a canonical-layout Eagle3 (what the engines load) from a trained deepspec-layout one",
        description="Copies the layer and vocabulary of a deepspec-layout Eagle3 into the canonical "
        "layout (3 captured layers, own lm_head = the target's rows) and refits fc by least squares "
        "on the target's hidden states over the first --num-rows rows of --data. Fine-tune the "
        "result with `python -m training train ... init_from=OUT`.",
    )
    p.add_argument("--source", required=True, type=Path, help="deepspec-layout eagle3 draft directory")
    p.add_argument("--data", nargs="+", required=True, type=Path, help="conversations jsonl (what it trained on)")
    p.add_argument("--num-rows", type=int, default=128, help="rows whose tokens fit fc (default 128)")
    p.add_argument("--max-len", type=int, default=768, help="tokens per row (default 768)")
    p.add_argument("--target", default="smollm2-135m", help="target alias, .gguf or HF directory")
    _add_chat_template(p)
    p.add_argument("--out", required=True, type=Path, help="draft directory to write (float32)")


def _run_relayout(args, parser) -> int:
    from deepspec.models import load_target
    from deepspec.models.drafts import DraftCheckpointError, load_draft, save_draft
    from training.data import load_sequences
    from training.relayout import canonical_from_deepspec

    if args.num_rows < 1:
        parser.error("--num-rows must be >= 1")
    import torch

    try:
        target = load_target(args.target, chat_template=args.chat_template)
        source = load_draft(args.source, target, dtype=torch.float32)
        rows = [s.input_ids for s in load_sequences(args.data, target, args.max_len)[: args.num_rows]]
        draft, fit = canonical_from_deepspec(source, target, rows)
    except (DraftCheckpointError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = {
        "source": str(args.source),
        "num_rows": len(rows),
        "fc_fit_tokens": fit.num_tokens,
        "fc_r_squared": fit.r_squared,
    }
    save_draft(draft, args.out)
    (args.out / "relayout.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({"out": str(args.out), **summary}))
    return 0


def _add_store(sub) -> None:
    from deepspec.models.drafts import STORAGE_DTYPES

    p = sub.add_parser(
        "store",
        help="rewrite a trained draft's weights in another storage dtype (e.g. int8, q4)",
        description="Re-stores model.safetensors of a neural draft directory in place: float32, "
        "bfloat16, int8 (one float32 scale per output row; a quarter of float32) or q4 (GGUF Q4_1 "
        "blocks of 32 inputs, float16 scale and minimum, 4-bit levels; matrices whose input size is "
        "not a multiple of 32 stay int8). Loading dequantizes to the compute dtype. Convert from the "
        "highest-precision copy there is (float32 or bf16): from int8 the weights are rounded twice. "
        "Re-run `python -m training eval` afterwards: the measured τ belongs to the stored weights.",
    )
    p.add_argument("--draft", required=True, nargs="+", type=Path, help="neural draft directories")
    p.add_argument("--storage-dtype", required=True, choices=STORAGE_DTYPES)


def _run_store(args) -> int:
    from deepspec.models.drafts import DraftCheckpointError, convert_draft_storage

    for path in args.draft:
        try:
            print(json.dumps({"draft": str(path), **convert_draft_storage(path, args.storage_dtype)}))
        except (DraftCheckpointError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    return 0


def _add_eval_workload(p, *, num_prompts: int, datasets_note: str = "") -> None:
    """The options `eval` and `curve` share: which target decodes how much of which eval sets, on how many threads.

    One definition, so a curve point is measured on the workload `eval` would name the same way."""
    p.add_argument("--target", default="smollm2-135m", help="target alias, .gguf or HF dir (default smollm2-135m)")
    _add_chat_template(p)
    p.add_argument(
        "--datasets",
        default="humaneval,gsm8k,mbpp",
        help=f'comma-separated eval sets from datasets/eval, or {{"turns"}} .jsonl(.gz) files such as '
        f"training/data/synth/prompts.heldout.jsonl.gz (default humaneval,gsm8k,mbpp){datasets_note}",
    )
    p.add_argument(
        "--num-prompts", type=int, default=num_prompts, help=f"first N prompts of each dataset (default {num_prompts})"
    )
    p.add_argument("--max-tokens", type=int, default=128, help="generated tokens per prompt (default 128)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")


def _add_eval(sub) -> None:
    p = sub.add_parser(
        "eval",
        help="acceptance length, verify rate, survival and speedup vs target-only",
        description="Runs target-only and draft decoding on the same prompts in one process; "
        "writes eval.json, eval.md and acceptance.png into --out (default: the draft directory).",
    )
    p.add_argument(
        "--draft",
        required=True,
        nargs="+",
        help="one or more draft checkpoint directories or built-in drafter names (prompt-lookup, auto); "
        "several share one target-only baseline per dataset and temperature. Drafting options "
        "follow a colon, so a tree sits next to its chain: drafts/smollm2-135m-corpus:tree=false "
        "drafts/smollm2-135m-corpus:tree=true (an optioned draft reports under runs/eval/<label>)",
    )
    _add_eval_workload(p, num_prompts=10)
    p.add_argument(
        "--temperatures",
        default="0,1.0",
        help="comma-separated temperatures; 0 = greedy (default '0,1.0'); speedup is timed per value",
    )
    p.add_argument(
        "--num-speculative-tokens", type=int, default=7, help="block / depth γ, or a tree's node count (default 7)"
    )
    p.add_argument(
        "--verify-all",
        action="store_true",
        help="verify every drafted token or tree node (vLLM's fixed num_speculative_tokens) instead of "
        "what the verify budget finds pays on this machine: the draft's full τ, at the speed that "
        "costs",
    )
    p.add_argument("--batch-size", type=int, default=1, help="engine batch size (default 1: latency)")
    p.add_argument("--dtype", default="float32", help="target dtype (float32 default; bf16 on GPU)")
    p.add_argument(
        "--quantization",
        default="none",
        choices=QUANTIZATIONS,
        help="target weights: none (dense in --dtype; default), gguf (the GGUF's own 4-bit matmul "
        "weights; CPU, bfloat16), auto (gguf where it applies)",
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--out", type=Path, default=None, help="report directory (default: the draft directory)")
    p.add_argument(
        "--compare",
        type=Path,
        default=None,
        help="also write every draft's rows side by side (τ, verify tokens per step, speedup) here",
    )
    p.add_argument(
        "--no-check-identical",
        action="store_true",
        help="skip asserting greedy draft output == target-only output token for token",
    )


def _add_curve(sub) -> None:
    p = sub.add_parser(
        "curve",
        help="τ against tokens seen: measure a training run's newest checkpoint, plot, fit",
        description="Decodes the run's newest checkpoint with the engine (greedy, γ 7, batch 1) on a "
        "fixed subset (first 4 prompts of humaneval, gsm8k, mbpp; 128 tokens) and appends (step, "
        "tokens seen, τ per set) to --record. --every-minutes repeats until the run writes its "
        "train_summary.json. --plot draws the record with the shipped drafts and corpus lookup.",
    )
    p.add_argument("--record", required=True, type=Path, help="JSON record of the curve (created, then appended)")
    p.add_argument("--run", type=Path, default=None, help="training run directory (output_dir) to measure")
    _add_eval_workload(p, num_prompts=4, datasets_note="; keep them fixed for one record")
    p.add_argument(
        "--every-minutes",
        type=float,
        default=None,
        help="keep measuring each new checkpoint, at most this often, until the run finishes",
    )
    p.add_argument("--plot", type=Path, default=None, help="write the τ-vs-tokens PNG here (after measuring)")
    p.add_argument(
        "--references",
        nargs="*",
        default=[],
        metavar="DIR=TOKENS",
        help="shipped drafts drawn as points: a draft directory (its eval.json greedy τ) and the "
        "tokens it was trained on, e.g. drafts/smollm2-135m-eagle3=451000",
    )
    p.add_argument(
        "--goal",
        type=Path,
        default=None,
        help="the draft to beat (e.g. drafts/smollm2-135m-corpus): its eval.json greedy τ per set is "
        "drawn dashed and the fit is solved for the tokens that reach its mean",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_prepare(sub)
    add_synth_parser(sub, _add_chat_template)
    add_card_parser(sub)
    _add_train(sub)
    _add_corpus(sub)
    _add_store(sub)
    _add_relayout(sub)
    _add_eval(sub)
    _add_curve(sub)
    return parser


def _check_prepare_args(args, parser) -> None:
    """A usage error for sizes below 1, a context that cannot hold the answer, or a template for an endpoint."""
    if args.max_tokens < 1 or args.batch_size < 1 or (args.threads is not None and args.threads < 1):
        parser.error("--max-tokens, --batch-size and --threads must be >= 1")
    if args.max_seq_len <= args.max_tokens:
        parser.error("--max-seq-len must exceed --max-tokens (it holds the prompt and the answer)")
    if args.endpoint and args.chat_template:
        parser.error(
            "--chat-template applies to the engine backend; the --endpoint server renders with its own "
            "template (vLLM, SGLang and our worker take --chat-template themselves)"
        )


def _run_prepare(args, parser) -> int:
    from training.data import recover_torn_gzip
    from training.prepare import PrepareStats, read_prompts

    _check_prepare_args(args, parser)
    recover_torn_gzip(args.out)  # a .gz output a killed run left cut short: resume after its whole lines
    stats = PrepareStats()
    try:
        rows = read_prompts(args.inputs, args.limit_per_file, args.seed, stats)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if stats.num_malformed:
        print(
            f"skipped {stats.num_malformed} malformed prompt lines (need a non-empty 'turns' list of strings)",
            file=sys.stderr,
        )
    if stats.num_heldout:
        print(f"left out {stats.num_heldout} synthetic prompts of the held-out split", file=sys.stderr)
    target = None
    if not args.endpoint:
        from deepspec.models.native import NativeUnavailable
        from training.prepare import load_engine_target

        try:  # every prompt is chat: a target without a template stops here, in one line
            target, backend = load_engine_target(
                args.target,
                args.backend,
                dtype=args.dtype,
                device=args.device,
                chat_template=args.chat_template,
                num_threads=args.threads,
            )
        except (ValueError, NativeUnavailable) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    else:
        backend = f"endpoint {args.endpoint}"
    print(f"regenerating {len(rows)} rows with {backend}, batch {args.batch_size} → {args.out}", file=sys.stderr)
    import time

    cpu_started = time.process_time()
    tokens_per_second = _regenerate_rows(args, rows, target, stats)
    summary = {
        "backend": backend,
        "done": stats.num_done,
        "skipped_finished": stats.num_skipped,
        "failed": stats.num_failed,
        "malformed": stats.num_malformed,
        "heldout": stats.num_heldout,
        "generated_tokens": stats.num_tokens,
        "tokens_per_second": round(tokens_per_second, 1),
    }
    if target is not None:  # wall time on a shared machine measures the neighbours too: this process's CPU time
        summary["tokens_per_cpu_second"] = round(stats.num_tokens / max(time.process_time() - cpu_started, 1e-9), 1)
    print(json.dumps(summary))
    return 1 if stats.num_failed and not stats.num_done else 0


def _regenerate_rows(args, rows: list, target, stats) -> float:
    """Answer every row not yet in args.out, through the --endpoint server (target None) or the engine on
    `target`, with a progress line → the tokens per second the progress measured."""
    from training.prepare import endpoint_backend, finished_ids, regenerate
    from training.progress import Progress

    with Progress(len(rows), "prepare") as progress:
        progress.resume_from(len({r.id for r in rows} & finished_ids(args.out)))
        if target is None:
            generate = endpoint_backend(args.endpoint, args.model, args.max_tokens, args.temperature, args.batch_size)
            regenerate(
                rows,
                generate,
                args.out,
                args.batch_size,
                stats,
                on_batch=lambda n, tok: progress.advance(n, tokens=tok, failed=stats.num_failed),
            )
        else:
            from deepspec.decoding.params import SamplingParams
            from training.prepare import stream_regenerate

            params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
            stream_regenerate(
                rows,
                target,
                params,
                args.out,
                stats,
                batch_size=args.batch_size,
                max_seq_len=args.max_seq_len,
                on_row=lambda tok: progress.advance(1, tokens=tok, failed=stats.num_failed),
            )
    return progress.tokens_per_second


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "prepare":
        return _run_prepare(args, parser)
    if args.command == "synth":
        from training.synth_run import run_synth_cli

        return run_synth_cli(args, parser)
    if args.command == "card":
        from training.card import run_card_cli

        return run_card_cli(args)
    if args.command == "train":
        from training.trainer import run_train_cli

        return run_train_cli(args, parser)
    if args.command == "corpus":
        return _run_corpus(args, parser)
    if args.command == "store":
        return _run_store(args)
    if args.command == "relayout":
        return _run_relayout(args, parser)
    if args.command == "curve":
        from training.curve import run_curve_cli

        return run_curve_cli(args, parser)
    from training.evaluate import run_eval_cli

    return run_eval_cli(args, parser)


if __name__ == "__main__":
    raise SystemExit(main())
