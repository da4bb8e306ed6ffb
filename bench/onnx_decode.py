"""ONNX Runtime rows of the batch-1 greedy decode benchmark, its int4 verify-step curve, and the export's cost.

Three parts, one run:

1. Export: `python -m export --format onnx` (fp32) and `--quantization int4` of the target with the default draft,
   each in its own process: wall time and peak RSS (the budget is 2 min and 4 GB on 2 cores).
2. Decode, interleaved prompt by prompt like bench/decode.py (this VM drifts by tens of percent over minutes):

       onnx                 the fp32 graph, target only
       onnx-int4            the 4-bit graph (MatMulNBits), target only
       onnx-int4+<draft>    the same with the export's draft (the default: the best shipped draft; a neural draft
                            runs through its own ONNX graphs)
       onnx-int8, onnx-int8+<draft>   int8 weights per channel (MatMulIntegerToFloat): cheaper multi-token verify
                            steps than MatMulNBits' on AVX2 CPUs (--skip onnx-int8 leaves both out)
       native, native+<draft>   the native CPU decoder (deepspec/models/native, compiled for this CPU; bit-exact
                            speculation by construction; --skip native leaves all its rows out), its layers on
                            the GGUF's own 4-bit blocks (the weights' auto choice for a Q4_1 target)
       native-int8, native-int8+<draft>   the same on the int8 graph's weights (--skip native-int8)
       served:<engine>      what `make serve` serves on this machine: the worker's --engine auto choice (measured on
                            its first start and cached: service/worker/fastest_backend.py) with the default draft
       llama.cpp            llama-cpp-python on the same GGUF (`make bench-deps`), the CPU peer every ratio divides by
       llama.cpp+prompt-lookup   llama.cpp's own speculative decoding (LlamaPromptLookupDecoding, 10 draft tokens)
       engine-q4            our PyTorch engine on the GGUF's own 4-bit weights (bf16), the peer when llama.cpp is absent
       engine-q4+<draft>    the same with the default draft

   Each row says how many outputs equal the fp32 graph's and, as "same first tokens", the median length of the
   prefix they share with it: quantized graphs drift late, a broken one (gibberish) at the first token. A drafted
   row also says how many equal its own target-only row's ("= own target-only"): speculation's losslessness.
       onnx-int4:exact, onnx-int8:exact (+<draft>)   the same graphs batch-invariant (DEEPSPEC_BATCH_INVARIANT,
                            deepspec/models/onnx_target.py): what bit-identical speculative output costs
                            (--skip exact leaves them out)

3. Verify-step curve: one forward of T = 1, 2, 4, 8, 16, 32 tokens after a 256-token context at batch 1, int4
   and int8 graphs and the native decoder, median of repeats. Speculation on CPU needs the T-token step to stay close
   to the 1-token one (the weights are read once per step either way): the aim is T=8 ≤ 1.3x and T=32 ≤ 1.6x.
   llama.cpp's own curve on the same GGUF (one `llama_decode` of T tokens, logits at every position, in its own
   process) and our PyTorch engine's (dense bf16, and the GGUF's 4-bit weights) sit beside them: whether any kernel
   on this CPU keeps a multi-token step near a one-token one.

ONNX Runtime runs with intra-op threads = torch's thread count (set OMP_NUM_THREADS / --threads), sequential
execution, all graph optimizations, threads spinning within a run (DEEPSPEC_ORT_SPINNING, default run).

    python -m bench.onnx_decode                                   # 5 prompts per set, 128 new tokens
    python -m bench.onnx_decode --num-prompts 2 --max-tokens 32   # a quick smoke run
    python -m bench.onnx_decode --temperature 1 --skip onnx,onnx-int4   # sampled: each draft against target-only
    python -m bench.onnx_decode --designs                         # compare graph/session designs (below)

`--designs` compares ways of building and running the int4 graph back to back in one process: each design's
verify-step curve (T = 1 is the target-only decode step) is timed in interleaved rounds, medians of wall and CPU
time reported. The designs are `DESIGNS` below; writes bench/results/onnx-designs.json.

Writes bench/results/onnx-decode.json.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.decode import (
    DATASETS,
    engine_decoder,
    gguf_file,
    llama_cpp_decoder,
    load_prompts,
    run_interleaved,
    summarize,
)
from bench.isolated import IsolatedDecoder, MethodTable, PeerFailed
from deepspec.models.step_curve import CURVE_CONTEXT, CURVE_SIZES, measure_step_curve

REPO = Path(__file__).resolve().parent.parent
#: the verify-step curve's widths and context: the library's own (the export and the worker time the same curve)
STEP_SIZES, STEP_CONTEXT = CURVE_SIZES, CURVE_CONTEXT


#: --designs: name -> (build_target_graph options, session options[, OnnxTarget options]); "b32-fused" is what the
#: export writes; the "-exact" ones time the batch-invariant target (a 1-token step padded to two rows)
DESIGNS = {
    "b32-plain": ({"block_size": 32, "fused": False}, {"spinning": "off"}),
    "b32-fused-acc0": ({"block_size": 32, "fused": True, "accuracy_level": 0}, {"spinning": "off"}),
    "b32-fused": ({"block_size": 32, "fused": True}, {"spinning": "off"}),
    "b32-fused-spin": ({"block_size": 32, "fused": True}, {"spinning": "always"}),
    "b64-fused": ({"block_size": 64, "fused": True}, {"spinning": "off"}),
    "b128-fused": ({"block_size": 128, "fused": True}, {"spinning": "off"}),
    "int8-fused": ({"quantization": "int8", "fused": True}, {"spinning": "off"}),
    "int8-fused-spin": ({"quantization": "int8", "fused": True}, {"spinning": "always"}),
    "b32-fused-spinrun": ({"block_size": 32, "fused": True}, {"spinning": "run"}),
    "int8-fused-spinrun": ({"quantization": "int8", "fused": True}, {"spinning": "run"}),
    "b32-fused-exact": ({"block_size": 32, "fused": True}, {"spinning": "off"}, {"batch_invariant": True}),
    "int8-fused-exact": ({"quantization": "int8", "fused": True}, {"spinning": "off"}, {"batch_invariant": True}),
}


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m bench.onnx_decode", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--target", default="smollm2-135m", help="alias or GGUF (default: %(default)s)")
    p.add_argument("--draft", default="auto", help="draft exported with the graphs (default: %(default)s)")
    p.add_argument("--num-prompts", type=int, default=5, help="prompts per dataset (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=128, help="new tokens per prompt (default: %(default)s)")
    p.add_argument("--num-speculative-tokens", type=int, default=7, help="draft depth k (default: 7)")
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="sampling temperature of our engine's rows (top-p 1, seeded; default 0 = greedy); the "
        "llama.cpp rows stay greedy",
    )
    p.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's)")
    p.add_argument("--step-repeats", type=int, default=15, help="timed runs per verify size (default: 15)")
    p.add_argument("--skip", default="", help="comma list of rows to skip (onnx, engine-q4, llama.cpp, ...)")
    p.add_argument(
        "--designs",
        nargs="?",
        const="all",
        default=None,
        help="compare graph/session designs instead: all of DESIGNS, or a comma list of their names",
    )
    p.add_argument("--rounds", type=int, default=9, help="--designs: interleaved timing rounds (default: 9)")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results JSON (default: bench/results/onnx-decode.json, onnx-designs.json with --designs)",
    )
    return p.parse_args(argv)


def export(target: str, draft: str, out: Path, quantization: str) -> dict:
    """Run the export CLI in a child process; its wall time and peak RSS (this process's other children are done)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "export",
            "--format",
            "onnx",
            "--target",
            target,
            "--draft",
            draft,
            "--quantization",
            quantization,
            "--out",
            str(out),
            "--force",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - t
    if result.returncode != 0:
        raise SystemExit(f"export failed: {result.stderr.strip()[-2000:]}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {
        "seconds": round(seconds, 1),
        "peak_rss_mb": round(max(peak, before) / 1024, 1),
        "bytes": sum(f.stat().st_size for f in out.rglob("*") if f.is_file()),
    }


def step_timer(target):
    """A function n -> seconds of one batch-1 forward of n tokens (logits at every position) after STEP_CONTEXT
    tokens of context; the context is prefilled once and every step overwrites the same cache positions."""
    import torch

    cache = target.new_cache(1, STEP_CONTEXT + max(STEP_SIZES) + 1)
    view = cache.rows(0, 1)
    context = torch.randint(0, target.vocab_size, (1, STEP_CONTEXT), generator=torch.Generator().manual_seed(0))
    target.forward(context, torch.zeros(1, dtype=torch.long), view, logits="last", max_start=0)
    start = torch.tensor([STEP_CONTEXT])
    steps = {n: torch.randint(0, target.vocab_size, (1, n)) for n in STEP_SIZES}

    def timed(n: int) -> float:
        t = time.perf_counter()
        target.forward(steps[n], start, view, logits="all", max_start=STEP_CONTEXT)
        return time.perf_counter() - t

    def timed_cpu(n: int) -> tuple[float, float]:
        """(wall seconds, CPU seconds of this process: every intra-op thread's work, not its waits for a core)."""
        c, t = time.process_time(), time.perf_counter()
        target.forward(steps[n], start, view, logits="all", max_start=STEP_CONTEXT)
        return time.perf_counter() - t, time.process_time() - c

    timed.with_cpu = timed_cpu

    for n in STEP_SIZES:
        timed(n)  # warm
    return timed


def llama_cpp_step_timer(gguf: str, threads: int):
    """llama.cpp's side of the verify-step curve, built in a child process (bench/isolated.py): `[n]` → one
    batch-1 `llama_decode` of n tokens after STEP_CONTEXT tokens of context, with logits at every position as a
    verify step needs (seconds). Same GGUF, same threads: whether llama.cpp's own 4-bit kernels keep a multi-token
    step near a 1-token one on this CPU, which is what the ONNX curve is measured against."""
    import numpy as np

    # llama-cpp-python comes with the bench extra (make bench-deps); make lint runs without it
    from llama_cpp import Llama  # pyright: ignore[reportMissingImports]

    llm = Llama(
        model_path=gguf,
        n_ctx=STEP_CONTEXT + 2 * max(STEP_SIZES),
        n_batch=max(STEP_SIZES),
        n_threads=threads,
        logits_all=True,
        verbose=False,
    )
    rng = np.random.default_rng(0)
    llm.eval(rng.integers(0, llm.n_vocab(), STEP_CONTEXT).tolist())
    steps = {n: rng.integers(0, llm.n_vocab(), n).tolist() for n in STEP_SIZES}

    def timed(ids):
        llm.n_tokens = STEP_CONTEXT  # the next eval overwrites the same cache positions
        t = time.perf_counter()
        llm.eval(steps[ids[0]])
        return [], time.perf_counter() - t, None

    for n in STEP_SIZES:
        timed([n])  # warm
    return timed


def llama_cpp_step_curve(gguf: str, threads: int, repeats: int) -> dict | None:
    """llama.cpp's verify-step curve (median of repeats), or None when the peer is missing or dies."""
    if importlib.util.find_spec("llama_cpp") is None:
        return None
    try:
        timed = IsolatedDecoder(llama_cpp_step_timer, gguf, threads, threads=threads)
    except PeerFailed:
        return None
    try:
        return curve_summary({n: statistics.median(timed([n])[1] for _ in range(repeats)) for n in STEP_SIZES})
    except PeerFailed:
        return None
    finally:
        timed.close()


def curve_summary(times: dict[int, float]) -> dict:
    return {str(n): {"ms": round(s * 1000, 2), "x_one_token": round(s / times[1], 2)} for n, s in times.items()}


def curve_table(title: str, curves: dict[str, dict], cpu: dict[str, dict] | None = None):
    """A rich table of step curves: a row per method (or design), a column per T; each cell the median ms, the CPU
    ms where `cpu` gives them, and the ratio to that method's own 1-token step."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("method")
    for n in STEP_SIZES:
        table.add_column(f"T={n}", justify="right")
    for name, curve in curves.items():
        cells = []
        for n in STEP_SIZES:
            cell = f"{curve[str(n)]['ms']:.1f}" + (f" / {cpu[name][str(n)]['ms']:.1f}" if cpu else "")
            cells.append(cell + (f" ({curve[str(n)]['x_one_token']:.2f}x)" if n > 1 else ""))
        table.add_row(name, *cells)
    return table


def step_curve(target, repeats: int) -> dict:
    """Median seconds of a batch-1 forward of T tokens after STEP_CONTEXT tokens of context, per T: the curve the
    export records and the worker compares engines by (deepspec/models/step_curve.py), as this table's cells."""
    return curve_summary(measure_step_curve(target, repeats=repeats))


def compare_designs(args, console) -> dict:
    """Build the int4 graph once per design from the same fp32 target, then time every design's step curve in
    interleaved rounds (design by design within a round, so drift hits all alike); medians per design and T, of
    wall time and of the process's CPU time. On a shared machine the CPU time is the steadier comparison of the
    work a design does (spinning designs burn CPU while waiting, so only their wall time means anything)."""
    import onnxruntime as ort
    import torch

    from deepspec.models import load_target, pytorch_decoder
    from deepspec.models.onnx_target import OnnxTarget, session_options
    from export.onnx.graph import build_target_graph

    threads = args.threads or torch.get_num_threads()
    reference = load_target(args.target, dtype="float32")
    decoder = pytorch_decoder(reference)
    work = Path(tempfile.mkdtemp(prefix="onnx-designs-"))
    graphs, timers = {}, {}
    chosen = DESIGNS if args.designs == "all" else {n: DESIGNS[n] for n in args.designs.split(",")}
    for name, (graph_options, run_options, *target_options) in chosen.items():
        key = tuple(sorted(graph_options.items()))
        if key not in graphs:
            out = work / f"graph{len(graphs)}"
            out.mkdir()
            console.log(f"building the graph {graph_options}")
            options = dict(graph_options)
            graphs[key] = build_target_graph(decoder, (), out, options.pop("quantization", "int4"), **options)
        session = ort.InferenceSession(
            str(graphs[key]), sess_options=session_options(threads, **run_options), providers=["CPUExecutionProvider"]
        )
        meta = {
            "graph": graphs[key].name,
            "quantization": graph_options.get("quantization", "int4"),
            "feature_layers": [],
            "max_positions": int(decoder.max_positions),
            "tied": True,
        }
        target = OnnxTarget(
            name,
            graphs[key].parent,
            reference.spec,
            reference.tokenizer,
            session,
            meta,
            STEP_CONTEXT + max(STEP_SIZES) + 1,
            tuple(reference.eos_token_ids),
            **(target_options[0] if target_options else {}),
        )
        timers[name] = step_timer(target)
    runs = {name: {n: [] for n in STEP_SIZES} for name in timers}
    cpu = {name: {n: [] for n in STEP_SIZES} for name in timers}
    for r in range(args.rounds):
        console.log(f"round {r + 1}/{args.rounds}")
        for name, timed in timers.items():
            for n in STEP_SIZES:
                wall, used = timed.with_cpu(n)
                runs[name][n].append(wall)
                cpu[name][n].append(used)
    results = {name: curve_summary({n: statistics.median(v) for n, v in per.items()}) for name, per in runs.items()}
    cpu_results = {name: curve_summary({n: statistics.median(v) for n, v in per.items()}) for name, per in cpu.items()}
    table = curve_table(
        f"verify step after {STEP_CONTEXT} tokens, batch 1, {threads} threads: median wall ms / "
        f"CPU ms of {args.rounds} interleaved rounds (x = this design's 1-token step, wall)",
        results,
        cpu_results,
    )
    from rich.console import Console

    Console(width=160).print(table)
    return {
        "threads": threads,
        "rounds": args.rounds,
        "context": STEP_CONTEXT,
        "designs": {
            name: {"graph": g, "session": s, "target": t[0] if t else {}} for name, (g, s, *t) in chosen.items()
        },
        "results": results,
        "cpu_results": cpu_results,
    }


def identical_to_own_target_only(rows: dict[str, dict[str, list]]) -> dict[str, dict[str, str]]:
    """Speculation's losslessness per row: for each drafted row of ours ("<target>+<draft>") whose target also ran
    without a draft ("<target>"), dataset -> "k/n" outputs equal to that row's, prompt by prompt (greedy only:
    sampled rows draw differently by design). llama.cpp's rows and rows without their own target-only are left out."""
    out = {}
    for name, per_ds in rows.items():
        own = rows.get(name.split("+")[0]) if "+" in name and not name.startswith("llama.cpp") else None
        if own:
            out[name] = {
                ds: f"{sum(a[0] == b[0] for a, b in zip(outputs, own[ds]))}/{len(outputs)}"
                for ds, outputs in per_ds.items()
                if ds in own
            }
    return out


def native_target(console, threads: int, spec: str = "smollm2-135m", weights: str = "auto"):
    """The native CPU decoder on `spec` with its layers' weights in `weights`, or None (logged) where it cannot be
    built here."""
    from deepspec.models.native import NativeUnavailable, load_native_target

    try:
        target = load_native_target(spec, max_seq_len=2048, num_threads=threads, weights=weights)
    except NativeUnavailable as e:
        console.log(f"[yellow]no native rows: {e}")
        return None
    console.log(f"native CPU decoder: {target.quantization} layers, {target.isa} kernels, {threads} threads")
    return target


def served_default(args) -> tuple[tuple, str]:
    """((target, drafter, label), reason): what the worker serves by default on this machine (--engine auto,
    service/worker/fastest_backend.py: measured on its first start, then cached), loaded as the worker loads it."""
    from service.worker.engine import load_served_model
    from service.worker.settings import WorkerSettings

    settings = WorkerSettings(
        target=args.target, draft=args.draft, backend="auto", num_speculative_tokens=args.num_speculative_tokens
    )
    choice, _, target, drafter = load_served_model(settings)
    label = f"{choice.backend}-{target.quantization}+{getattr(drafter, 'name', 'none')}"
    return (target, drafter, label), f"{choice.backend}: {choice.reason}"


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    from rich.console import Console
    from rich.table import Table

    from deepspec.decoding import build_drafter
    from deepspec.models import load_target
    from deepspec.models.onnx_target import load_onnx_target

    console = Console(stderr=True)
    if args.designs:
        torch.set_num_threads(args.threads or torch.get_num_threads())
        out = args.out or REPO / "bench" / "results" / "onnx-designs.json"
        result = compare_designs(args, console)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        console.log(f"wrote {out}")
        return 0
    args.out = args.out or REPO / "bench" / "results" / "onnx-decode.json"
    skip = set(filter(None, args.skip.split(",")))
    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    work = Path(tempfile.mkdtemp(prefix="onnx-bench-"))
    exports = {}
    quantizations = ["none", "int4"] + (["int8"] if "onnx-int8" not in skip else [])
    for quantization in quantizations:
        console.log(f"exporting the {quantization} graph")
        exports[quantization] = export(args.target, args.draft, work / quantization, quantization)
    console.log(f"exports: {exports}")

    reference = load_target(args.target, dtype="float32")
    prompts = load_prompts(reference, args.num_prompts)
    warmup_ids = prompts[DATASETS[0]][0]
    table = MethodTable(console.log, skip)
    decoders, add = table.decoders, table.add

    fp32 = load_onnx_target(work / "none", max_seq_len=2048, num_threads=threads)
    int4 = load_onnx_target(work / "int4", max_seq_len=2048, num_threads=threads)
    k = args.num_speculative_tokens

    def ours(target, drafter):
        return engine_decoder(target, drafter, args.max_tokens, k, warmup_ids, args.temperature)

    add("onnx", lambda: ours(fp32, None))
    add("onnx-int4", lambda: ours(int4, None))
    int8 = load_onnx_target(work / "int8", max_seq_len=2048, num_threads=threads) if "int8" in exports else None
    if int8 is not None:
        add("onnx-int8", lambda: ours(int8, None))
    quantized = [("onnx-int4", int4), ("onnx-int8", int8)]
    if "exact" not in skip:
        quantized += [
            (
                f"{name}:exact",
                load_onnx_target(
                    work / name.removeprefix("onnx-"), max_seq_len=2048, num_threads=threads, batch_invariant=True
                ),
            )
            for name, target in quantized
            if target is not None
        ]
    for name, target in quantized:
        if name.endswith(":exact"):
            add(name, lambda target=target: ours(target, None))
        draft_dir = work / name.removeprefix("onnx-").removesuffix(":exact") / "draft"
        if target is not None and draft_dir.is_dir():  # the export's draft (neural ones through their graphs)
            drafter = build_drafter(str(draft_dir), target)
            assert drafter is not None  # a draft directory always builds one
            add(f"{name}+{drafter.name}", lambda target=target, drafter=drafter: ours(target, drafter))
    native = native_target(console, threads, args.target) if "native" not in skip else None
    native_int8 = None
    if native is not None:  # the native CPU decoder (compiled here), target only and with the draft: its own
        # choice of weights (the GGUF's 4-bit blocks here), and int8 beside it where that choice differs
        natives = [("native", native)]
        if native.quantization != "int8" and "native-int8" not in skip:
            native_int8 = native_target(console, threads, args.target, weights="int8")
            if native_int8 is not None:  # None: it did not build (native_target logged why)
                natives.append(("native-int8", native_int8))
        for name, target in natives:
            add(name, lambda target=target: ours(target, None))
            drafter = build_drafter(args.draft, target) if args.draft != "none" else None
            if drafter is not None:
                add(f"{name}+{drafter.name}", lambda target=target, drafter=drafter: ours(target, drafter))
    served, reason = served_default(args)
    console.log(f"the worker's default engine here (--engine auto): {reason}")
    add(f"served:{served[2]}", lambda: ours(served[0], served[1]))
    if importlib.util.find_spec("llama_cpp") is not None:  # in a process of its own (bench/isolated.py)
        for row, lookup in (("llama.cpp", 0), ("llama.cpp+prompt-lookup", 10)):
            add(
                row,
                lambda lookup=lookup: IsolatedDecoder(
                    llama_cpp_decoder,
                    str(gguf_file(args.target)),
                    args.max_tokens,
                    warmup_ids,
                    threads,
                    lookup,
                    threads=threads,
                ),
            )
    else:
        console.log("[yellow]llama-cpp-python not installed (make bench-deps): engine-q4 is the peer")
    # our PyTorch engine's targets on the same weights, loaded once: the dense bf16 one (bench.decode's `engine`)
    # and the GGUF's 4-bit one, the decode peer when llama.cpp is absent; both get a verify-step curve below
    engines = {
        "engine-bf16": lambda: load_target(args.target, dtype="bfloat16", quantization="none"),
        "engine-q4": lambda: load_target(args.target, dtype="bfloat16", quantization="gguf"),
    }
    engines = {name: functools.cache(load) for name, load in engines.items()}
    if "llama.cpp" not in decoders:
        add("engine-q4", lambda: ours(engines["engine-q4"](), None))
    if args.draft != "none":  # what `make serve` ran before it measured its engine: PyTorch, 4-bit, default draft
        add(
            f"engine-q4+{args.draft}",
            lambda: ours(engines["engine-q4"](), build_drafter(args.draft, engines["engine-q4"]())),
        )
    peer = "llama.cpp" if "llama.cpp" in decoders else "engine-q4"

    rows, failed = run_interleaved(decoders, prompts, console.log)
    for decoder in decoders.values():
        if isinstance(decoder, IsolatedDecoder):
            decoder.close()
    summary = {name: summarize(r, rows.get("onnx", {})) for name, r in rows.items()}
    lossless = identical_to_own_target_only(rows) if args.temperature == 0 else {}
    for name, per_ds in summary.items():
        for ds, r in per_ds.items():
            r["identical_to_target_only"] = lossless.get(name, {}).get(ds)
    sampling = f"temperature {args.temperature:g} (llama.cpp greedy)" if args.temperature > 0 else "greedy"
    table = Table(
        title=f"batch-1 {sampling} decode through ONNX Runtime, {args.max_tokens} new tokens, "
        f"{args.num_prompts} prompts/dataset, {threads} threads; ratios to {peer}"
    )
    for col in (
        "method",
        "dataset",
        "tok/s",
        "median tok/s",
        "tau",
        f"x {peer}",
        "identical to onnx",
        "same first tokens",
        "= own target-only",
    ):
        table.add_column(col, justify="left" if col in ("method", "dataset") else "right")
    for name, per_ds in summary.items():
        for ds in DATASETS:
            r = per_ds[ds]
            base = summary.get(peer, {}).get(ds)
            r[f"x_{peer}"] = round(r["tokens_per_s"] / base["tokens_per_s"], 2) if base else None
            table.add_row(
                name,
                ds,
                f"{r['tokens_per_s']:.1f}",
                f"{r['median_tokens_per_s']:.1f}",
                f"{r['acceptance_length']:.2f}" if r["acceptance_length"] else "-",
                f"{r[f'x_{peer}']:.2f}" if r[f"x_{peer}"] else "-",
                r["identical_to_reference"] or "-",
                "-" if r["median_common_prefix"] is None else f"{r['median_common_prefix']:g}",
                r["identical_to_target_only"] or "-",
            )
        table.add_section()
    Console(width=140).print(table)

    console.log("verify-step curves (batch 1)")
    curves = {
        q: step_curve(t, args.step_repeats)
        for q, t in (("int4", int4), ("int8", int8), ("native", native), ("native-int8", native_int8))
        if t is not None
    }
    curve = curves["int4"]
    if (
        "llama.cpp" not in skip
        and (peer_curve := llama_cpp_step_curve(str(gguf_file(args.target)), threads, args.step_repeats)) is not None
    ):
        curves["llama.cpp"] = peer_curve
    for name, load in engines.items():  # so the table says which multi-token steps this CPU keeps cheap
        curves[name] = step_curve(load(), args.step_repeats)
    Console(width=140).print(
        curve_table(
            f"verify step of T tokens after {STEP_CONTEXT} tokens, batch 1, {threads} "
            f"threads: median ms of {args.step_repeats} (x = the same method's 1-token "
            "step)",
            curves,
        )
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "args": {k: str(v) for k, v in vars(args).items()},
                "threads": threads,
                "peer": peer,
                "failed": failed,
                "exports": exports,
                "results": summary,
                "verify_step": curve,
                "verify_step_int8": curves.get("int8"),
                "verify_step_native": curves.get("native"),
                "verify_step_native_int8": curves.get("native-int8"),
                "verify_step_llama_cpp": curves.get("llama.cpp"),
                "verify_step_engine": {n: curves[n] for n in engines},
            },
            indent=2,
        )
        + "\n"
    )
    console.log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
