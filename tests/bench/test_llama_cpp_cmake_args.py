"""The llama.cpp build flags `make llama-cpp` derives from the CPU: native everywhere but on AMX CPUs, where every
other extension the CPU has is named and ggml's AMX backend (it segfaults on the first decode) stays off."""

from __future__ import annotations

import subprocess
import sys

from bench.llama_cpp_cmake_args import cmake_args, cpu_flags

ZEN4 = "flags\t\t: fpu sse2 avx avx2 fma f16c bmi2 avx512f avx512_vnni avx512_bf16 avx_vnni\n"
XEON_AMX = "processor\t: 0\nflags\t\t: fpu avx avx2 fma f16c bmi2 avx512f avx512vbmi avx512_vnni amx_tile amx_int8\n"


def test_a_cpu_without_amx_builds_natively():
    assert cmake_args(cpu_flags(ZEN4)) == "-DGGML_NATIVE=ON"
    assert cmake_args(cpu_flags("")) == "-DGGML_NATIVE=ON"  # no /proc/cpuinfo: the compiler's -march=native


def test_an_amx_cpu_names_its_other_extensions_and_leaves_amx_off():
    args = cmake_args(cpu_flags(XEON_AMX)).split()
    assert args[0] == "-DGGML_NATIVE=OFF"
    on = {a.removeprefix("-D").removesuffix("=ON") for a in args if a.endswith("=ON")}
    assert on == {
        "GGML_AVX",
        "GGML_AVX2",
        "GGML_FMA",
        "GGML_F16C",
        "GGML_BMI2",
        "GGML_AVX512",
        "GGML_AVX512_VBMI",
        "GGML_AVX512_VNNI",
    }
    assert {
        "-DGGML_AVX512_BF16=OFF",
        "-DGGML_AVX_VNNI=OFF",
        "-DGGML_AMX_TILE=OFF",
        "-DGGML_AMX_INT8=OFF",
        "-DGGML_AMX_BF16=OFF",
    } <= set(args)


def test_the_script_prints_this_machines_args_with_the_standard_library_alone():
    out = subprocess.run(
        [sys.executable, "-I", "bench/llama_cpp_cmake_args.py"], capture_output=True, text=True, check=True
    )
    assert out.stdout.startswith("-DGGML_NATIVE=")
