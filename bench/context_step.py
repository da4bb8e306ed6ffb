"""The one-token decode step as the context grows: the native CPU decoder against llama.cpp (same GGUF, threads).

    python -m bench.context_step                 # ~1 min on 2 cores; writes bench/results/context_step.json
    python -m bench.context_step --positions 64,128 --repeats 3   # a smoke run

Attention reads every key and value of a row's context at every step, so a step's cost grows with the context while
the weights' reads stay fixed. For SmolLM2 (30 layers, 3 KV heads of 64) a float32 cache is 46 KB a position and a
float16 one 23 KB (the native decoder's and llama.cpp's default): at 8 rows after 256 positions a float32 cache
read as many bytes per step as the 4-bit weights. Rows:

    native B=1      the native decoder, one row at the position
    native B=8      8 rows decoding together, each at the position (the service at concurrency 8)
    llama.cpp B=1   llama-cpp-python on the same GGUF, in a process of its own (bench/isolated.py; skipped when not
                    installed or when it dies)

Each cell is the median of --repeats one-token steps; every step rewrites the same cache position, so the context
stays what was prefilled once. Ratios divide llama.cpp's step by the native one at the same position.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.isolated import IsolatedDecoder, PeerFailed

ROWS = 8


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m bench.context_step", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--target", default="smollm2-135m", help="alias or GGUF (default: %(default)s)")
    p.add_argument("--positions", default="128,512,1024,1792", help="comma list of context lengths")
    p.add_argument("--repeats", type=int, default=9, help="timed steps per cell (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="threads of both decoders (default: torch's)")
    p.add_argument("--out", default=str(REPO_ROOT / "bench" / "results" / "context_step.json"))
    return p.parse_args(argv)


def native_steps(target, positions: list[int], repeats: int) -> dict[str, dict[int, float]]:
    """{"native B=1": {position: ms}, "native B=8": ...}: one context prefilled into row 0 and copied to the others."""
    import torch

    cache = target.new_cache(ROWS, max(positions) + 1)
    context = torch.randint(0, target.vocab_size, (1, max(positions)), generator=torch.Generator().manual_seed(0))
    target.forward(context, torch.zeros(1, dtype=torch.long), cache.rows(0, 1), logits="none", max_start=0)
    cache.k[:, 1:ROWS] = cache.k[:, :1]
    cache.v[:, 1:ROWS] = cache.v[:, :1]
    token = torch.randint(0, target.vocab_size, (ROWS, 1), generator=torch.Generator().manual_seed(1))
    out: dict[str, dict[int, float]] = {}
    for rows in (1, ROWS):
        view = cache.rows(0, rows)
        times = out[f"native B={rows}"] = {}
        for position in positions:
            start = torch.full((rows,), position)
            target.forward(token[:rows], start, view, logits="all", max_start=position)  # warm
            samples = []
            for _ in range(repeats):
                t = time.perf_counter()
                target.forward(token[:rows], start, view, logits="all", max_start=position)
                samples.append(time.perf_counter() - t)
            times[position] = statistics.median(samples) * 1000
    return out


def llama_cpp_step_timer(gguf: str, threads: int, longest: int):
    """Built in a child process: `[position]` → ([], seconds of one batch-1 `llama_decode` of one token after
    `position` tokens of context, None)."""
    import numpy as np

    # llama-cpp-python comes with the bench extra (make bench-deps); make lint runs without it
    from llama_cpp import Llama  # pyright: ignore[reportMissingImports]

    llm = Llama(model_path=gguf, n_ctx=longest + 16, n_batch=512, n_threads=threads, verbose=False)
    rng = np.random.default_rng(0)
    llm.eval(rng.integers(0, llm.n_vocab(), longest).tolist())
    token = [int(rng.integers(0, llm.n_vocab()))]

    def timed(ids):
        llm.n_tokens = ids[0]  # the eval rewrites this cache position (and drops those after it)
        t = time.perf_counter()
        llm.eval(token)
        return [], time.perf_counter() - t, None

    return timed


def llama_cpp_steps(gguf: str, threads: int, positions: list[int], repeats: int) -> dict[int, float] | None:
    if importlib.util.find_spec("llama_cpp") is None:
        print("llama-cpp-python is not installed (make bench-deps): its row is skipped", file=sys.stderr)
        return None
    try:
        timed = IsolatedDecoder(llama_cpp_step_timer, gguf, threads, max(positions), threads=threads)
    except PeerFailed as e:
        print(f"llama.cpp: {e}", file=sys.stderr)
        return None
    try:
        times = {}
        # longest first: llama-cpp-python's eval drops the cache entries from its position on, so the context
        # below each position must still be there when its turn comes
        for position in sorted(positions, reverse=True):
            timed([position])  # warm
            times[position] = statistics.median(timed([position])[1] for _ in range(repeats)) * 1000
        return times
    except PeerFailed as e:
        print(f"llama.cpp: {e}", file=sys.stderr)
        return None
    finally:
        timed.close()


def table(rows: dict[str, dict[int, float]], positions: list[int]) -> str:
    """Markdown: a row per method, ms per position; then llama.cpp's step over the native one where both ran."""
    lines = [
        "| method | " + " | ".join(f"{p} positions" for p in positions) + " |",
        "| --- |" + " --- |" * len(positions),
    ]
    for name, times in rows.items():
        lines.append(f"| {name} ms | " + " | ".join(f"{times[p]:.2f}" for p in positions) + " |")
    if "llama.cpp B=1" in rows:
        lines.append(
            "| llama.cpp / native B=1 | "
            + " | ".join(f"{rows['llama.cpp B=1'][p] / rows['native B=1'][p]:.2f}x" for p in positions)
            + " |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from bench.decode import gguf_file
    from bench.machine import cpu_flags
    from deepspec.models.native import load_native_target

    positions = sorted({int(p) for p in args.positions.split(",")})
    threads = args.threads or torch.get_num_threads()
    target = load_native_target(args.target, max_seq_len=max(positions) + 1, num_threads=threads)
    rows = native_steps(target, positions, args.repeats)
    peer = llama_cpp_steps(str(gguf_file(args.target)), threads, positions, args.repeats)
    if peer is not None:
        rows["llama.cpp B=1"] = peer
    print(
        f"one-token decode step by context length ({args.target}, native {target.quantization} layers, float16 "
        f"KV cache, {threads} threads; median of {args.repeats}); CPU flags: {cpu_flags()}"
    )
    print(table(rows, positions))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "args": vars(args),
                "cpu_flags": cpu_flags(),
                "threads": threads,
                "ms": {name: {str(p): t for p, t in times.items()} for name, times in rows.items()},
            },
            indent=1,
        )
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
