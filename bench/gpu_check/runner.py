"""Runs each part in a process of its own and collects its rows: a part that crashes (a faulting kernel poisons the
whole CUDA context), hangs past its budget or raises costs its own rows only.

The child is this package's `--run-part` entry: it rebuilds the `Context`, runs one part's `run(context)` and
writes its rows as JSON to a file the parent reads back.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

from bench.gpu_check.context import Context
from bench.gpu_check.environment import PART_MODULES, missing_modules
from bench.gpu_check.report import FAIL, SKIPPED, PartResult, Row, part_status
from bench.isolated import describe_exit

#: part name → module with `run(context) -> list[Row]`, in the order they run
PARTS = {
    "kernels": "bench.gpu_check.kernels",
    "engine": "bench.gpu_check.engine",
    "training": "bench.gpu_check.train_steps",
    "onnx": "bench.gpu_check.onnx_runtime",
    "tensorrt": "bench.gpu_check.tensorrt_plugin",
    "vllm": "bench.gpu_check.vllm_draft",
}
#: a part's process is killed this long after its budget (its rows stop at the budget; setup may overrun it)
GRACE_SECONDS = 60
WHEELS_HINT = "run `make gpu-wheels` where there is network and carry .whl/ with the checkout"


def run_part_in_process(name: str, context: Context) -> list[Row]:
    context.part_started = time.perf_counter()
    context.part_budget_seconds = context.sizes.budget_seconds[name]
    return importlib.import_module(PARTS[name]).run(context)


def child_main(name: str, context: Context, rows_file: Path) -> int:
    """The `--run-part` entry: rows (or the exception as one FAIL row) into rows_file."""
    try:
        rows = run_part_in_process(name, context)
    except Exception as exc:
        traceback.print_exc()
        rows = [Row(name, FAIL, f"{type(exc).__name__}: {str(exc)[:300]}")]
    rows_file.write_text(json.dumps([dataclasses.asdict(r) for r in rows]))
    return 0


def child_command(name: str, argv_for_child: list[str], rows_file: Path) -> list[str]:
    return [sys.executable, "-m", "bench.gpu_check", *argv_for_child, "--run-part", name, "--rows-file", str(rows_file)]


def run_part(
    name: str,
    context: Context,
    argv_for_child: list[str],
    *,
    in_process: bool = False,
    command: list[str] | None = None,
    deadline: float = float("inf"),
    log=print,
) -> PartResult:
    """One part → its result. In a child process (`command`, default `child_command`), killed at its budget plus
    GRACE_SECONDS or at `deadline` (time.perf_counter()) if sooner, unless `in_process`: then the part shares this
    process (a CPU run: no CUDA context to poison, and no second import of torch)."""
    missing = missing_modules(PART_MODULES[name])
    if missing:
        return PartResult(name, SKIPPED, 0.0, detail=f"missing modules: {', '.join(missing)} ({WHEELS_HINT})")
    time_left = deadline - time.perf_counter()
    if time_left <= 0:
        return PartResult(name, SKIPPED, 0.0, detail="the check's total time budget is spent")
    rows_file = context.workdir / f"rows-{name}.json"
    rows_file.unlink(missing_ok=True)
    budget_seconds = context.sizes.budget_seconds[name]
    timeout_seconds = min(budget_seconds + GRACE_SECONDS, time_left)
    t0 = time.perf_counter()
    log(f"part {name}: running (budget {budget_seconds:.0f} s{', in this process' if in_process else ''})")
    if in_process:
        child_main(name, context, rows_file)
        rows = [Row(**r) for r in json.loads(rows_file.read_text())]
        return PartResult(name, part_status(rows), time.perf_counter() - t0, rows)
    try:
        proc = subprocess.run(
            command or child_command(name, argv_for_child, rows_file),
            capture_output=True,
            text=True,
            timeout=timeout_seconds,
        )
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-500:]
        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        return PartResult(
            name, FAIL, time.perf_counter() - t0, detail=f"killed after {timeout_seconds:.0f} s; stderr tail: {tail!r}"
        )
    seconds = time.perf_counter() - t0
    if not rows_file.is_file():
        return PartResult(
            name, FAIL, seconds, detail=f"{describe_exit(proc.returncode)}; stderr tail: {proc.stderr[-500:]!r}"
        )
    rows = [Row(**r) for r in json.loads(rows_file.read_text())]
    return PartResult(name, part_status(rows), seconds, rows)
