"""Command line of the GPU check (the runbook is the package docstring: bench/gpu_check/__init__.py)."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.gpu_check.sizes import FULL, QUICK

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "bench" / "results" / "gpu_check.json"
#: where the wheels of `.whl/` are installed (gitignored build/); first on sys.path when present
SITE_DIR = ROOT / "build" / "gpu-check-site"


def parse_args(argv):
    from bench.gpu_check.runner import PARTS

    p = argparse.ArgumentParser(
        prog="python -m bench.gpu_check",
        description=(
            "kernels vs reference, the engine with every drafter, training steps and the ONNX export on one GPU; "
            "prints a table and writes JSON"
        ),
    )
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cuda (default; the check is for a GPU machine) or cpu (every part that can run without one)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="every part at tiny sizes (a 4-layer target, a few tokens): seconds on a CPU",
    )
    p.add_argument(
        "--parts",
        default=",".join(PARTS),
        help=f"comma-separated subset of {','.join(PARTS)} (default all, in that order)",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON report (default {DEFAULT_OUT})")
    p.add_argument(
        "--wheels",
        type=Path,
        default=ROOT / ".whl",
        help="wheels `make gpu-wheels` downloaded for what the machine lacks (default .whl/; absent = none)",
    )
    p.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="scratch directory for the target, drafts and exports (default a temporary one, removed)",
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="run every part in this process, not one process each (saves the imports on a CPU; a GPU "
        "fault or a hang then ends the whole check)",
    )
    p.add_argument("--run-part", default=None, help=argparse.SUPPRESS)
    p.add_argument("--rows-file", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--target-dir", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.parts = [s.strip() for s in args.parts.split(",") if s.strip()]
    unknown = [s for s in args.parts if s not in PARTS]
    if unknown:
        p.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    return args


def _context(args, workdir: Path, target_dir: Path):
    from bench.gpu_check.context import Context

    return Context(args.device, QUICK if args.quick else FULL, workdir, target_dir)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # the table is the output: no per-file progress bars from transformers' loads and saves (children inherit it)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if args.run_part:  # a part's own process (runner.run_part): the parent installed the wheels already
        from bench.gpu_check.runner import child_main

        return child_main(args.run_part, _context(args, args.workdir, args.target_dir), args.rows_file)

    from bench.gpu_check.environment import PART_MODULES, describe, install_wheels, missing_modules

    installed = install_wheels(args.wheels, SITE_DIR)
    missing = missing_modules(PART_MODULES["setup"])
    if missing:
        print(f"gpu_check: missing modules {', '.join(missing)}: every part needs them", file=sys.stderr)
        return 1
    for name in args.parts:
        if missing := missing_modules(PART_MODULES[name]):
            print(f"gpu_check: part {name} will be skipped: missing modules {', '.join(missing)}", file=sys.stderr)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            f"gpu_check: needs a CUDA GPU (torch {torch.__version__}: torch.cuda.is_available() is False); "
            "--device cpu runs the parts that work without one",
            file=sys.stderr,
        )
        return 1
    from bench.gpu_check.report import FAIL, OK, PartResult, table, write_json
    from bench.gpu_check.runner import run_part
    from bench.gpu_check.target import write_target_dir

    sizes = QUICK if args.quick else FULL
    environment = {**describe(), "installed_wheels": installed, "device": args.device}
    print(
        "gpu_check: "
        + ", ".join(f"{k} {v}" for k, v in environment["versions"].items() if v)
        + (f"; GPU {environment['gpu']['name']}" if "gpu" in environment else "")
    )
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        try:
            write_target_dir(workdir / "target", sizes.target)
            results = [
                PartResult(
                    "setup",
                    OK,
                    time.perf_counter() - t0,
                    detail=(
                        f"random {sizes.name} target ({sizes.target['num_hidden_layers']} layers, hidden "
                        f"{sizes.target['hidden_size']}, vocab {sizes.target['vocab_size']})"
                    ),
                )
            ]
        except Exception as exc:  # no target, no part: the table and JSON still say why
            results = [PartResult("setup", FAIL, time.perf_counter() - t0, detail=f"{type(exc).__name__}: {exc}")]
        child_argv = [
            "--device",
            args.device,
            "--workdir",
            str(workdir),
            "--target-dir",
            str(workdir / "target"),
            *(["--quick"] if args.quick else []),
        ]
        context = _context(args, workdir, workdir / "target")
        for name in args.parts if results[0].status == OK else []:
            results.append(
                run_part(name, context, child_argv, in_process=args.in_process, deadline=t0 + sizes.total_seconds)
            )
            print(f"part {name}: {results[-1].status} in {results[-1].seconds:.1f} s", flush=True)
            write_json(args.out, environment, sizes.as_dict(), results, complete=False)  # kept if we are cut short
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(table(results))
    path = write_json(args.out, environment, sizes.as_dict(), results, complete=True)
    print(f"wrote {path}")
    return 1 if any(r.status == FAIL for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
