"""Command line of the plugins package.

python -m plugins build --arch 90 --out build/plugins         # CI: sm_90 PTX + cubin + index.json (~1 min)
python -m plugins build --arch 80,89,90 --out build/plugins   # every arch we ship
python -m plugins check                                        # on a GPU: Triton kernels vs the reference
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _archs(text: str) -> list[int]:
    try:
        archs = [int(a) for a in text.split(",") if a.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--arch takes compute capabilities like 80,89,90, got {text!r}") from None
    if not archs or any(a < 70 for a in archs):
        raise argparse.ArgumentTypeError(f"--arch needs capabilities >= 70 (Volta), got {text!r}")
    return archs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plugins", description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="compile every Triton kernel ahead of time (no GPU needed)")
    b.add_argument("--arch", type=_archs, default=[90], help="comma-separated SM versions, e.g. 80,89,90 (default 90)")
    b.add_argument("--out", type=Path, required=True, help="output directory for .ptx, .cubin and index.json")
    b.add_argument("--jobs", type=int, default=2, help="parallel compiler processes (default 2)")
    sub.add_parser("check", help="on a CUDA device: every op's Triton kernel vs the CPU reference, with timings")
    args = parser.parse_args(argv)

    if args.command == "build":
        from rich.progress import Progress

        from plugins.aot import build, kernel_specs

        total = len(kernel_specs()) * len(args.arch)
        with Progress(disable=not sys.stderr.isatty()) as progress:
            task = progress.add_task("compiling kernels", total=total)
            index = build(args.arch, args.out, args.jobs, on_done=lambda e: progress.advance(task))
        print(
            f"built {len(index['kernels'])} kernels for sm {','.join(map(str, args.arch))} into {args.out} "
            f"(triton {index['triton']}); index: {args.out / 'index.json'}"
        )
        return 0

    from plugins.check import NoCudaError, run_checks

    try:
        results = run_checks()
    except NoCudaError as exc:
        print(f"plugins check: {exc}", file=sys.stderr)
        return 1
    print(f"{'op':<20} {'case':<22} {'result':<24} {'triton ms':>10} {'reference ms':>13}")
    for r in results:
        print(
            f"{r.op:<20} {r.case:<22} {('ok ' if r.ok else 'FAIL ') + r.detail:<24} {r.kernel_ms:>10.3f} "
            f"{r.reference_ms:>13.3f}"
        )
    failed = [r for r in results if not r.ok]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
