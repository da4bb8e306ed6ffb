"""Part `kernels`: every plugin kernel compiled by the installed triton, then (on CUDA) every kernel against the
CPU reference (`python -m plugins check`'s cases).

The kernels are written against the triton pinned in the `plugins` extra; a GPU machine may have an older one
(triton 3.6 beside torch 2.11). Compiling each kernel ahead of time for this GPU's arch (plugins/aot.py, the same
compiler the JIT path runs at the first launch) names the one kernel a version cannot build, where a launch
inside the engine would only fail the whole run; the other kernels' rows still read ok.
"""

from __future__ import annotations

import time

from bench.gpu_check.report import FAIL, OK, SKIPPED, Row

#: processes compiling kernels at once
MAX_COMPILE_WORKERS = 8


def _arch(device: str) -> int:
    import torch

    if device == "cuda":
        major, minor = torch.cuda.get_device_capability()
        return major * 10 + minor
    return 90  # no GPU: compile for Hopper, which needs only the CPU


def compile_one(spec, arch: int) -> tuple[str, float]:
    """→ (error or "", seconds) of compiling one kernel spec for sm_<arch>; runs in a worker process."""
    from plugins.aot import compile_kernel

    t0 = time.perf_counter()
    try:
        compile_kernel(spec, arch)
    except Exception as exc:  # one kernel a triton version cannot build must not hide the others
        first_line = str(exc).splitlines()[0][:160] if str(exc) else ""
        return f"{type(exc).__name__}: {first_line}", time.perf_counter() - t0
    return "", time.perf_counter() - t0


def compile_rows(device: str, max_compiles: int | None) -> list[Row]:
    """Every kernel spec compiled in parallel (one process per core, up to MAX_COMPILE_WORKERS): ~3 s each."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    import triton

    from plugins.aot import kernel_specs

    arch = _arch(device)
    specs = kernel_specs()[:max_compiles]
    workers = max(1, min(MAX_COMPILE_WORKERS, len(specs), os.cpu_count() or 1))
    if workers == 1:
        outcomes = [compile_one(spec, arch) for spec in specs]
    else:
        # spawned, not forked: this process has a CUDA context by now, which a forked child must not inherit
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            outcomes = list(pool.map(compile_one, specs, [arch] * len(specs)))
    where = f"triton {triton.__version__} sm_{arch}"
    return [
        Row(
            f"compile {spec.stem}",
            FAIL if error else OK,
            f"{where}: {error}" if error else where,
            {} if error else {"compile_s": round(seconds, 2)},
        )
        for spec, (error, seconds) in zip(specs, outcomes)
    ]


def reference_rows(device: str) -> list[Row]:
    """`python -m plugins check` in process: one row per op and case; kernel and reference ms side by side."""
    if device != "cuda":
        return [Row("kernels vs reference", SKIPPED, "no CUDA device: the Triton kernels launch on GPU tensors only")]
    from plugins.check import run_checks

    return [
        Row(
            f"{r.op} {r.case}",
            OK if r.ok else FAIL,
            r.detail,
            {"kernel_ms": round(r.kernel_ms, 4), "reference_ms": round(r.reference_ms, 4)},
        )
        for r in run_checks()
    ]


def run(context) -> list[Row]:
    rows = compile_rows(context.device, context.sizes.max_kernel_compiles)
    try:
        rows += reference_rows(context.device)
    except Exception as exc:
        rows.append(Row("kernels vs reference", FAIL, f"{type(exc).__name__}: {exc}"))
    return rows
