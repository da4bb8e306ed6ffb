"""The CMake arguments that build llama.cpp for the CPU it runs on: what `make llama-cpp` compiles the benchmarks'
CPU peer (and the tests' real OpenAI servers) with.

    python bench/llama_cpp_cmake_args.py            # prints e.g. -DGGML_NATIVE=ON

A native build (`-DGGML_NATIVE=ON`, i.e. -march=native) everywhere but on CPUs with AMX: there -march=native also
compiles ggml's AMX backend, whose matmul segfaults on the first decode of the default target's Q4_1 GGUF
(llama-cpp-python 0.3.36 on a Xeon with amx_tile/amx_int8; llama.cpp issue ggml-org/llama.cpp#20824, the same
crash, closed unfixed). So on an AMX CPU the build names every x86 extension the CPU has, one ggml option each,
and leaves the AMX ones off: the peer still runs AVX-512, VNNI and BF16 kernels, just not the crashing backend.
Standard library only: it runs before anything else is installed.
"""

from __future__ import annotations

from pathlib import Path

#: /proc/cpuinfo flag -> the ggml CMake option that compiles for it (ggml/CMakeLists.txt's GGML_* ISA options)
GGML_OPTIONS = {
    "avx": "GGML_AVX",
    "avx2": "GGML_AVX2",
    "fma": "GGML_FMA",
    "f16c": "GGML_F16C",
    "bmi2": "GGML_BMI2",
    "avx_vnni": "GGML_AVX_VNNI",
    "avx512f": "GGML_AVX512",
    "avx512vbmi": "GGML_AVX512_VBMI",
    "avx512_vnni": "GGML_AVX512_VNNI",
    "avx512_bf16": "GGML_AVX512_BF16",
}
#: the flags that mark a CPU whose native build would compile the AMX backend
AMX_FLAGS = ("amx_tile", "amx_int8", "amx_bf16")


def cpu_flags(cpuinfo: str) -> set[str]:
    line = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def cmake_args(flags: set[str]) -> str:
    if not flags & set(AMX_FLAGS):
        return "-DGGML_NATIVE=ON"
    options = [f"-D{option}={'ON' if flag in flags else 'OFF'}" for flag, option in GGML_OPTIONS.items()]
    return " ".join(
        ["-DGGML_NATIVE=OFF", *options, "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
    )


def main() -> int:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: the compiler's own -march=native
        cpuinfo = ""
    print(cmake_args(cpu_flags(cpuinfo)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
