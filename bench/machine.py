"""What the machine under a benchmark is, printed beside every table: the CPU's SIMD flags decide how flat a
multi-token verify step is, and which llama.cpp build the peer row ran (native or the portable fallback)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from deepspec.models.step_curve import SIMD_FLAGS, cpu_flags  # one reading of the CPU for every table and manifest

__all__ = ["SIMD_FLAGS", "cpu_flags", "llama_cpp_build", "write_results"]


def write_results(path, args, **results) -> Path:
    """A benchmark's JSON record: its arguments, this CPU's flags and what it measured; the path is printed."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "cpu_flags": cpu_flags(), **results}, indent=1, default=str))
    print(f"wrote {out}")
    return out


def llama_cpp_build() -> str:
    """llama.cpp's own system info (the instruction sets it was compiled for), read in a child process: importing a
    build made for another CPU may die with SIGILL, which must not take the benchmark down."""
    code = "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    if out.returncode:
        return f"not importable (exit {out.returncode})"
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else "unknown"
