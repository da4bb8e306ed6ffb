"""Batch-1 greedy decoding benchmark: Hugging Face generate vs our engine, with and without drafts.

Every method decodes the same prompts (N each from humaneval, gsm8k and mbpp, chat template, greedy, fixed
number of new tokens) in ONE run, interleaved: each prompt is decoded by every method in turn before the next
prompt starts. This VM's speed drifts by ±30% over minutes; run one method after another and a ratio measures
the drift as much as the methods. Interleaved, every method sees the same machine phases:

    hf-generate            transformers generate (the baseline every ratio divides by)
    hf-prompt-lookup       transformers generate(prompt_lookup_num_tokens=...)
    llama.cpp              llama-cpp-python plain decoding on the same GGUF (the CPU peer; `make bench-deps`), in a
                           process of its own: if it crashes, its row says "crashed: signal N" and the rest goes on
    llama.cpp+prompt-lookup  llama.cpp's own speculative decoding (LlamaPromptLookupDecoding, 10 draft tokens), the
                           peer to beat with drafts; ratios still divide by the plain rows
    engine                 our target-only engine (dense weights in --dtype)
    engine+<drafter>       our engine with prompt lookup and every shipped draft under drafts/
    engine+<draft>[tree]   the default draft's other shape (--trees): its token tree next to its chain, or its
                           chain next to its tree, so the table shows what a tree buys per verify pass
    engine-q4[+<drafter>]  the same with the GGUF's own 4-bit matmul weights (--quantization gguf; bf16 only)

Runbook:
    make bench                                            # defaults below, bf16
    python -m bench.decode --num-prompts 2 --max-tokens 32    # a quick smoke run
    python -m bench.decode --dtype float32 --drafters prompt-lookup
    python -m bench.decode --quantizations gguf --skip hf-prompt-lookup   # only the 4-bit engine rows

Reports tokens/s per dataset (total tokens ÷ total time, and the median over prompts), mean acceptance length,
the tokens each verify pass scored (1 + a chain's drafts or a tree's nodes) with the draft's shape, the ratio to
hf-generate and to our target-only engine with the same weights, and how many outputs are token-identical to that
engine. Writes bench/results/decode-<dtype>.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

from bench.isolated import IsolatedDecoder, MethodTable, PeerFailed
from bench.machine import cpu_flags, llama_cpp_build

DATASETS = ("humaneval", "gsm8k", "mbpp")
#: every method first decodes this many tokens of the first prompt, untimed: its first timed prompt then runs
#: on warm allocator pools and caches like the ones after it
WARMUP_TOKENS = 32
#: the row name of the target-only engine for each --quantizations value
ENGINE_LABELS = {"none": "engine", "gguf": "engine-q4"}


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m bench.decode", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--target", default="smollm2-135m", help="alias, GGUF file or HF dir (default: %(default)s)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"], help="weights and activations")
    p.add_argument("--num-prompts", type=int, default=5, help="prompts per dataset (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=128, help="new tokens per prompt (default: %(default)s)")
    p.add_argument("--num-speculative-tokens", type=int, default=7, help="draft block / depth k (default: 7)")
    p.add_argument(
        "--drafters",
        default="prompt-lookup,shipped",
        help="comma list: prompt-lookup, shipped (every draft under drafts/), or checkpoint dirs",
    )
    p.add_argument(
        "--trees",
        default="default",
        choices=["default", "all", "none"],
        help="add the other shape (tree or chain) of the default draft (`auto`'s pick; default), of "
        "every draft that has one, or of none",
    )
    p.add_argument(
        "--quantizations",
        default=None,
        help="comma list of target weight formats to run the engine rows with: none (dense --dtype), gguf "
        "(4-bit GGUF weights; bf16 only). Default: none,gguf in bfloat16, none in float32",
    )
    p.add_argument("--skip", default="", help="comma list of methods to skip, e.g. hf-prompt-lookup,llama.cpp")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default: bench/results/decode-<dtype>.json)")
    return p.parse_args(argv)


def load_prompts(target, n: int, datasets=DATASETS) -> dict[str, list[list[int]]]:
    """The first `n` first turns of each eval set in `datasets`, as chat-templated token ids."""
    from deepspec.paths import eval_dataset

    prompts = {}
    for name in datasets:
        with eval_dataset(name).open() as f:
            turns = [json.loads(line)["turns"][0] for _, line in zip(range(n), f)]
        prompts[name] = [target.encode_chat([{"role": "user", "content": t}]) for t in turns]
    return prompts


# Each method is a decoder: built (and warmed up) once, then called per prompt → (tokens, seconds, tau or None,
# verify tokens per step or None).


def engine_decoder(target, drafter, max_tokens, k, warmup_ids, temperature: float = 0.0):
    """Our engine at batch 1, with `drafter` or target-only (None); greedy, or sampled at `temperature` (top-p 1,
    one fixed seed, so every row of a table draws from the same generator)."""
    from deepspec.decoding import SamplingParams, SpecEngine
    from deepspec.decoding.planner import BudgetPlanner
    from training.evaluate import verify_tokens_per_step

    engine = SpecEngine(
        target, drafter, max_batch_size=1, max_seq_len=2048, num_speculative_tokens=k, planner=BudgetPlanner()
    )
    params = SamplingParams(
        max_tokens=max_tokens, ignore_eos=True, temperature=temperature, seed=0 if temperature > 0 else None
    )
    engine.generate([warmup_ids], SamplingParams(max_tokens=WARMUP_TOKENS))
    engine.forget_acceptance()  # the warm-up is not traffic: the budget's prior starts from the first prompt

    def decode(ids):
        t = time.perf_counter()
        result = engine.generate([ids], params)[0]
        seconds = time.perf_counter() - t
        vps = verify_tokens_per_step([result]) if drafter is not None else None
        return result.token_ids, seconds, result.acceptance_length, vps

    return decode


def shape_variants(spec: str, drafter, target, build) -> list[tuple[str, object]]:
    """The other shape of a draft directory: [(row suffix "[tree]" or "[chain]", drafter)], or [] when the
    algorithm drafts no trees or this build of its drafter takes no tree option (a clear log line, no row)."""
    from training.draft_specs import is_tree_drafter, tree_variants

    out = []
    for variant in tree_variants(spec):
        try:
            other = build(variant.base, target, **variant.options)
        except (TypeError, ValueError) as e:
            print(f"no {variant.label} row: {e}", file=sys.stderr)
            continue
        if is_tree_drafter(other) != is_tree_drafter(drafter):
            out.append((f"[{'tree' if is_tree_drafter(other) else 'chain'}]", other))
    return out


def hf_decoder(target, max_tokens, prompt_lookup: int | None, warmup_ids):
    import torch

    model = target.hf_model()
    kwargs: dict[str, object] = dict(
        max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False, pad_token_id=target.eos_token_ids[0]
    )
    if prompt_lookup:
        kwargs["prompt_lookup_num_tokens"] = prompt_lookup
    with torch.inference_mode():
        model.generate(
            torch.tensor([warmup_ids]),
            max_new_tokens=WARMUP_TOKENS,
            do_sample=False,
            pad_token_id=target.eos_token_ids[0],
        )

    def decode(ids):
        with torch.inference_mode():
            t = time.perf_counter()
            out = model.generate(torch.tensor([ids]), **kwargs)
            return out[0, len(ids) :].tolist(), time.perf_counter() - t, None

    return decode


def llama_cpp_decoder(gguf: str, max_tokens, warmup_ids, n_threads: int, prompt_lookup: int = 0):
    """llama-cpp-python's greedy decoding of the same GGUF: plain, or with its own speculative decoding
    (`LlamaPromptLookupDecoding`, prompt_lookup > 0 draft tokens per step) for the second peer row. Built in a
    child process (`IsolatedDecoder`): llama.cpp is native code, and a build for the wrong CPU dies with SIGILL,
    which must cost this row only."""
    # llama-cpp-python comes with the bench extra (make bench-deps); make lint runs without it
    from llama_cpp import Llama  # pyright: ignore[reportMissingImports]

    draft = None
    if prompt_lookup:
        # llama-cpp-python comes with the bench extra (make bench-deps); make lint runs without it
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding  # pyright: ignore[reportMissingImports]

        draft = LlamaPromptLookupDecoding(num_pred_tokens=prompt_lookup)
    llm = Llama(model_path=gguf, n_ctx=2048, n_threads=n_threads, verbose=False, draft_model=draft)

    def greedy(ids, n):
        tokens = []
        for token in llm.generate(ids, temp=0.0, top_k=1, reset=True):
            tokens.append(token)
            if len(tokens) >= n:
                break
        return tokens

    greedy(warmup_ids, WARMUP_TOKENS)

    def decode(ids):
        t = time.perf_counter()
        tokens = greedy(ids, max_tokens)
        return tokens, time.perf_counter() - t, None

    return decode


def gguf_file(target_spec: str) -> Path:
    """The GGUF file behind a target alias (or the path itself), for the peers that read GGUF directly."""
    from deepspec.models.aliases import ALIASES

    return ALIASES[target_spec].locate() if target_spec in ALIASES else Path(target_spec)


def run_interleaved(decoders: dict, prompts: dict[str, list[list[int]]], log) -> tuple[dict, dict[str, str]]:
    """Every prompt decoded by every method in turn → (rows[method][dataset], status of each method that failed).

    A method whose process dies (`PeerFailed`) leaves the rotation and the results: a row measured on part of the
    prompts would not compare with the others. The remaining methods go on."""
    failed: dict[str, str] = {}
    rows = {name: {ds: [] for ds in prompts} for name in decoders}
    for ds, ds_prompts in prompts.items():
        for i, ids in enumerate(ds_prompts):
            live = [name for name in decoders if name not in failed]
            log(f"{ds} prompt {i + 1}/{len(ds_prompts)}: {len(live)} methods in turn")
            for name in live:
                try:
                    rows[name][ds].append(decoders[name](ids))
                except PeerFailed as e:
                    log(f"[red]{name} {e}: its row is left out, the other methods go on")
                    failed[name] = str(e)
    return {name: r for name, r in rows.items() if name not in failed}, failed


def summarize(rows_by_dataset, reference_by_dataset):
    out = {}
    for name, rows in rows_by_dataset.items():
        tokens = sum(len(r[0]) for r in rows)
        seconds = sum(r[1] for r in rows)
        taus = [r[2] for r in rows if r[2] is not None]
        widths = [r[3] for r in rows if len(r) > 3 and r[3] is not None]
        ref = reference_by_dataset.get(name)
        identical = sum(r[0] == ref_row[0] for r, ref_row in zip(rows, ref)) if ref else None
        # how far a non-identical output follows the reference (a quantized graph drifts late; a broken one at once)
        prefix = statistics.median(_common_prefix(r[0], ref_row[0]) for r, ref_row in zip(rows, ref)) if ref else None
        out[name] = {
            "tokens": tokens,
            "seconds": round(seconds, 3),
            "tokens_per_s": round(tokens / seconds, 2),
            "median_tokens_per_s": round(statistics.median(len(r[0]) / r[1] for r in rows), 2),
            "acceptance_length": round(statistics.mean(taus), 3) if taus else None,
            "verify_tokens_per_step": round(statistics.mean(widths), 3) if widths else None,
            "identical_to_reference": f"{identical}/{len(rows)}" if identical is not None else None,
            "median_common_prefix": prefix,
        }
    return out


def _common_prefix(a: list[int], b: list[int]) -> int:
    """Tokens a and b share before they first differ."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    from rich.console import Console
    from rich.table import Table

    from deepspec.decoding import build_drafter
    from deepspec.models import load_target
    from training.draft_specs import is_tree_drafter

    console = Console(stderr=True)
    skip = set(filter(None, args.skip.split(",")))
    quantizations = (args.quantizations or ("none,gguf" if args.dtype == "bfloat16" else "none")).split(",")
    target = load_target(args.target, dtype=args.dtype)
    prompts = load_prompts(target, args.num_prompts)
    warmup_ids = prompts[DATASETS[0]][0]
    table = MethodTable(console.log, skip)
    decoders, failed_to_start, add = table.decoders, table.failed_to_start, table.add

    default_draft = None
    if args.trees == "default":
        from deepspec.decoding.registry import best_shipped_draft

        found = best_shipped_draft(target)
        default_draft = found.resolve() if found else None
    shapes: dict[str, str] = {}  # row name → "tree" | "chain" for the rows that draft
    drafter_specs = []
    for spec in filter(None, args.drafters.split(",")):
        if spec == "shipped":
            from deepspec.paths import repo_root

            drafter_specs += [
                str(d) for d in sorted((repo_root() / "drafts").glob("*")) if (d / "config.json").is_file()
            ]
        else:
            drafter_specs.append(spec)
    for quantization in quantizations:
        engine_target = (
            target if quantization == "none" else load_target(args.target, dtype=args.dtype, quantization=quantization)
        )
        prefix = ENGINE_LABELS[quantization]
        add(
            prefix,
            lambda t=engine_target: engine_decoder(t, None, args.max_tokens, args.num_speculative_tokens, warmup_ids),
        )
        for spec in drafter_specs:
            try:
                drafter = build_drafter(spec, engine_target)
            except (ValueError, FileNotFoundError) as e:
                console.log(f"[yellow]skipping drafter {spec}: {e}")
                continue
            rows = [(f"{prefix}+{Path(spec).name}", drafter)]
            if args.trees == "all" or (default_draft is not None and Path(spec).resolve() == default_draft):
                rows += [
                    (f"{prefix}+{Path(spec).name}{suffix}", other)
                    for suffix, other in shape_variants(spec, drafter, engine_target, build_drafter)
                ]
            for row, d in rows:
                shapes[row] = "tree" if is_tree_drafter(d) else "chain"
                add(
                    row,
                    lambda t=engine_target, d=d: engine_decoder(
                        t, d, args.max_tokens, args.num_speculative_tokens, warmup_ids
                    ),
                )
    add("hf-generate", lambda: hf_decoder(target, args.max_tokens, None, warmup_ids))
    add("hf-prompt-lookup", lambda: hf_decoder(target, args.max_tokens, 10, warmup_ids))
    # found, not imported: importing a wrongly built llama.cpp may already die; only its own process may try
    if importlib.util.find_spec("llama_cpp") is not None:
        for row, lookup in (("llama.cpp", 0), ("llama.cpp+prompt-lookup", 10)):
            add(
                row,
                lambda lookup=lookup: IsolatedDecoder(
                    llama_cpp_decoder,
                    str(gguf_file(args.target)),
                    args.max_tokens,
                    warmup_ids,
                    torch.get_num_threads(),
                    lookup,
                    threads=torch.get_num_threads(),
                ),
            )
    else:
        console.log("[yellow]llama-cpp-python not installed (make bench-deps): skipping the llama.cpp peer")

    methods, failed = run_interleaved(decoders, prompts, console.log)
    failed = {**failed_to_start, **failed}

    def engine_for(name):
        """The target-only engine row a method is compared with: the one with the same weights for our drafts,
        the dense engine for the peers (HF, llama.cpp)."""
        return name.split("+")[0] if name.startswith("engine") else "engine"

    # identical-output rate: our drafts and llama.cpp against our target-only engine, HF prompt lookup against
    # HF generate
    def reference_for(name):
        return methods.get("hf-generate" if name.startswith("hf-") else engine_for(name), {})

    summary = {name: summarize(rows, reference_for(name)) for name, rows in methods.items()}
    table = Table(
        title=f"batch-1 greedy decode, {args.dtype}, {args.max_tokens} new tokens, "
        f"{args.num_prompts} prompts/dataset, torch threads {torch.get_num_threads()}"
    )
    for col in (
        "method",
        "dataset",
        "tok/s",
        "median tok/s",
        "tau",
        "verify tok/step",
        "x HF generate",
        "x engine",
        "x llama.cpp",
        "identical",
    ):
        table.add_column(
            col,
            justify="left" if col in ("method", "dataset") else "right",
            overflow="fold" if col == "method" else "ellipsis",
        )  # "+draft[tree]" must stay readable
    for name, per_ds in summary.items():
        for ds in DATASETS:
            r = per_ds[ds]
            base = summary.get("hf-generate", {}).get(ds)
            eng = summary.get(engine_for(name), {}).get(ds)
            r["x_hf_generate"] = round(r["tokens_per_s"] / base["tokens_per_s"], 2) if base else None
            r["x_engine"] = round(r["tokens_per_s"] / eng["tokens_per_s"], 2) if eng else None
            peer = summary.get("llama.cpp", {}).get(ds)
            r["x_llama_cpp"] = round(r["tokens_per_s"] / peer["tokens_per_s"], 2) if peer else None
            r["shape"] = shapes.get(name)
            table.add_row(
                name,
                ds,
                f"{r['tokens_per_s']:.1f}",
                f"{r['median_tokens_per_s']:.1f}",
                f"{r['acceptance_length']:.2f}" if r["acceptance_length"] else "-",
                f"{r['verify_tokens_per_step']:.2f} {r['shape']}" if r["verify_tokens_per_step"] else "-",
                f"{r['x_hf_generate']:.2f}" if r["x_hf_generate"] else "-",
                f"{r['x_engine']:.2f}" if r["x_engine"] else "-",
                f"{r['x_llama_cpp']:.2f}" if r["x_llama_cpp"] else "-",
                "ref" if name in (*ENGINE_LABELS.values(), "hf-generate") else r["identical_to_reference"],
            )
        table.add_section()
    for name, status in failed.items():
        table.add_row(name, status, *["-"] * 8)
        summary[name] = {"status": status}
    Console(width=130).print(table)
    machine = {"cpu_flags": cpu_flags(), "llama_cpp_build": llama_cpp_build() if "llama.cpp" in methods else None}
    console.log(f"CPU flags: {machine['cpu_flags']}; llama.cpp build: {machine['llama_cpp_build']}")
    for decoder in decoders.values():
        if isinstance(decoder, IsolatedDecoder):
            decoder.close()
    out = args.out or Path(__file__).parent / "results" / f"decode-{args.dtype}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {"args": {k: str(v) for k, v in vars(args).items()}, "machine": machine, "results": summary}, indent=2
        )
    )
    console.log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
