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


def _arch(device: str) -> int:
    import torch

    if device == "cuda":
        major, minor = torch.cuda.get_device_capability()
        return major * 10 + minor
    return 90  # no GPU: compile for Hopper, which needs only the CPU


def compile_rows(device: str, max_compiles: int | None) -> list[Row]:
    import triton

    from plugins.aot import compile_kernel, kernel_specs

    arch = _arch(device)
    rows = []
    for spec in kernel_specs()[:max_compiles]:
        t0 = time.perf_counter()
        try:
            compile_kernel(spec, arch)
        except Exception as exc:  # one kernel a triton version cannot build must not hide the others
            rows.append(Row(f"compile {spec.stem}", FAIL, f"triton {triton.__version__} sm_{arch}: "
                            f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"))
            continue
        rows.append(Row(f"compile {spec.stem}", OK, f"triton {triton.__version__} sm_{arch}",
                        {"compile_s": round(time.perf_counter() - t0, 2)}))
    return rows


def reference_rows(device: str) -> list[Row]:
    """`python -m plugins check` in process: one row per op and case; kernel and reference ms side by side."""
    if device != "cuda":
        return [Row("kernels vs reference", SKIPPED, "no CUDA device: the Triton kernels launch on GPU tensors only")]
    from plugins.check import run_checks

    return [Row(f"{r.op} {r.case}", OK if r.ok else FAIL, r.detail,
                {"kernel_ms": round(r.kernel_ms, 4), "reference_ms": round(r.reference_ms, 4)})
            for r in run_checks()]


def run(context) -> list[Row]:
    rows = compile_rows(context.device, context.sizes.max_kernel_compiles)
    try:
        rows += reference_rows(context.device)
    except Exception as exc:
        rows.append(Row("kernels vs reference", FAIL, f"{type(exc).__name__}: {exc}"))
    return rows
