"""What the machine under a benchmark is, printed beside every table: the CPU's SIMD flags decide how flat a
multi-token verify step is, and which llama.cpp build the peer row ran (native or the portable fallback)."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

#: the flags that change the kernels' speed (int8 dot products, bf16, AMX tiles)
SIMD_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8")


def cpu_flags() -> str:
    """The SIMD flags of /proc/cpuinfo this machine has, e.g. 'avx2 fma f16c'."""
    try:
        line = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"
    have = set(line.split(":", 1)[1].split())
    return " ".join(f for f in SIMD_FLAGS if f in have) or "none of " + ", ".join(SIMD_FLAGS)


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
