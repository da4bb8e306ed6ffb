"""Compile decoder.c for the machine that runs it, once, and load it.

Why at first use and not at install: the kernels are chosen by the instruction sets the compiler is told the CPU
has (`-march=native`), and a library built for another CPU dies with SIGILL on this one (a llama.cpp wheel built on
an AMX Xeon did, elsewhere). So the shared library is built here, into `<cache>/native/<key>/`, the key hashing the
source, the compiler, its flags and this CPU's model and flags: a new CPU, compiler or source builds anew, and every
later load (each worker start, each test process) only opens the file. The build is written to a temporary name and
renamed, so processes starting together never load a half-written library.

Needs a C11 compiler with POSIX threads (`cc`, or `$CC`; Debian's gcc). Without one, `NativeUnavailable` says what
is missing; the engine choice (service/worker/fastest_backend.py) then serves another engine.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from deepspec.paths import cache_dir

SOURCE = Path(__file__).with_name("decoder.c")
#: the ABI version decoder.c reports (ds_abi): bumped with any change to a function's signature
ABI = 7
FLAGS = ("-O3", "-march=native", "-pthread", "-shared", "-fPIC", "-std=c11")


class NativeUnavailable(RuntimeError):
    """The native decoder cannot be built or loaded here; the message names what is missing."""


def compiler() -> str:
    """$CC, or the first of cc, gcc, clang on PATH; NativeUnavailable naming what is missing."""
    named = os.environ.get("CC")
    if named:
        if not shutil.which(named):
            raise NativeUnavailable(
                f"CC={named} is not an executable C compiler: the native CPU decoder is compiled "
                "on first use (unset CC to use cc, gcc or clang from PATH)"
            )
        return named
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise NativeUnavailable(
            "the native CPU decoder is compiled on first use and needs a C compiler "
            "(apt-get install gcc, or set CC); none was found on PATH"
        )
    return cc


def _compiler_version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return cc


def _cpu_key() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return "|".join(next((line for line in lines if line.startswith(k)), "") for k in ("model name", "flags"))
    except OSError:
        import platform

        return platform.processor() or platform.machine()


def library_path() -> Path:
    cc = compiler()
    key = hashlib.sha256(
        "\n".join([SOURCE.read_text(), _compiler_version(cc), " ".join(FLAGS), _cpu_key()]).encode()
    ).hexdigest()[:16]
    return cache_dir() / "native" / key / "libdeepspec_decoder.so"


def build(path: Path, flags: tuple[str, ...] = FLAGS) -> Path:
    """Compile decoder.c into `path` (atomically); NativeUnavailable with the compiler's message on failure."""
    cc = compiler()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".build-", suffix=".so")
    os.close(fd)
    try:
        try:
            done = subprocess.run(
                [cc, *flags, str(SOURCE), "-o", tmp, "-lm"], capture_output=True, text=True, timeout=600
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise NativeUnavailable(f"building the native CPU decoder with {cc} failed: {exc}") from exc
        if done.returncode:
            raise NativeUnavailable(
                f"building the native CPU decoder with {cc} failed (it needs C11 atomics and "
                f"POSIX threads):\n{done.stderr.strip()[-2000:]}"
            )
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


class Config(ctypes.Structure):
    """decoder.c's ds_config, field for field."""

    _fields_ = [
        (name, ctypes.c_int)
        for name in (
            "hidden",
            "layers",
            "heads",
            "kv_heads",
            "head_dim",
            "inter",
            "vocab",
            "max_positions",
            "threads",
            "qk_norm",
            "gelu",
            "sandwich",
        )
    ] + [(name, ctypes.c_float) for name in ("eps", "attn_scale", "embed_scale")]


_LIBRARY: ctypes.CDLL | None = None


def load_library() -> ctypes.CDLL:
    """The compiled decoder, built on first use; its functions typed (one CDLL per process)."""
    global _LIBRARY
    if _LIBRARY is not None:
        return _LIBRARY
    path = library_path()
    if not path.is_file():
        build(path)
    _LIBRARY = _open(path)
    return _LIBRARY


def library_for(march: str, directory: Path) -> ctypes.CDLL:
    """decoder.c built for another instruction set than this CPU's (`-march=x86-64-v3`: the AVX2 kernels;
    `x86-64`: the portable ones) into `directory`: what the tests run the other kernel families with, on a CPU that
    has their instructions. Not cached: each call builds."""
    flags = tuple(f"-march={march}" if f == "-march=native" else f for f in FLAGS)
    return _open(build(directory / f"libdeepspec_decoder-{march}.so", flags))


def _open(path: Path) -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise NativeUnavailable(f"cannot load the native CPU decoder {path}: {exc}") from exc
    if lib.ds_abi() != ABI:
        raise NativeUnavailable(f"{path} reports ABI {lib.ds_abi()}, this package expects {ABI}: delete it to rebuild")
    _declare(lib)
    return lib


def _declare(lib: ctypes.CDLL) -> None:
    p, i, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
    lib.ds_isa.restype = ctypes.c_char_p
    lib.ds_model_new.argtypes, lib.ds_model_new.restype = [p], p
    lib.ds_model_free.argtypes, lib.ds_model_free.restype = [p], None
    lib.ds_set_linear.argtypes, lib.ds_set_linear.restype = [p, i, i, p, p, p, i, i], i
    lib.ds_set_linear_q4.argtypes, lib.ds_set_linear_q4.restype = [p, i, i, p, p, p, p, i, i], i
    lib.ds_set_norm.argtypes, lib.ds_set_norm.restype = [p, i, i, p, i], i
    lib.ds_set_window.argtypes, lib.ds_set_window.restype = [p, i, i, i], None
    lib.ds_set_tables.argtypes, lib.ds_set_tables.restype = [p, p, p, p, p, p], None
    lib.ds_forward.argtypes = [p, i, i, p, p, p, p, p, p, i64, i64, i64, p, i, p, p, i, p, p]
    lib.ds_forward.restype = i
    lib.ds_set_draft.argtypes, lib.ds_set_draft.restype = [p, i], None
    lib.ds_draft_step.argtypes = [p, i, i, p, i64, i64, p, p, p, p, p, p, i, p, p, i64, i64, p, p]
    lib.ds_draft_step.restype = i
    lib.ds_draft_logits.argtypes, lib.ds_draft_logits.restype = [p, i, p, p], i
    lib.ds_draft_chain.argtypes = [p, i, i, p, p, p, p, p, p, i64, i64, p, p, p, p]
    lib.ds_draft_chain.restype = i
