"""`python -m plugins build` (ahead-of-time PTX/cubin without a GPU, checked against its index) and `check`."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from plugins.aot import kernel_specs

ROOT = Path(__file__).resolve().parents[2]


def _run(*args, timeout=600):
    # the kernel tests switch the interpreter on for this process; a build must compile for real
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "plugins", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_build_for_sm90_writes_ptx_whose_entries_match_the_index(tmp_path):
    pytest.importorskip("triton")
    out = tmp_path / "aot"
    proc = _run("build", "--arch", "90", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    index = json.loads((out / "index.json").read_text())
    assert len(index["kernels"]) == len(kernel_specs())
    for entry in index["kernels"]:
        ptx = (out / entry["ptx"]).read_text()
        assert re.search(rf"\.entry {re.escape(entry['entry'])}\(", ptx), entry
        assert ".target sm_90a" in ptx
        assert (out / entry["cubin"]).stat().st_size > 0
        assert entry["arch"] == 90 and entry["num_warps"] >= 1 and entry["shared_bytes"] >= 0
        assert list(entry["signature"]) == list(
            next(s.signature for s in kernel_specs() if s.kernel == entry["kernel"] and s.variant == entry["variant"])
        )
        assert _ptx_params(ptx, entry["entry"])[: len(_launched(entry["signature"]))] == _launched(entry["signature"])


def _launched(signature: dict) -> list[str]:
    """The parameters a launch passes, in signature order: 64 bits per pointer and i64, 32 per i32 (constexprs are
    compiled in). TensorRT passes an AOT kernel its input pointers, i32 scalars and output pointers; triton may
    append parameters of its own after them."""
    return ["b64" if t.startswith("*") or t == "i64" else "b32" for t in signature.values() if t != "constexpr"]


def _ptx_params(ptx: str, entry: str) -> list[str]:
    match = re.search(rf"\.entry {re.escape(entry)}\((.*?)\)", ptx, re.S)
    assert match is not None, f"no .entry {entry} in the PTX"
    params = match.group(1)
    return ["b64" if width == "64" else "b32" for width in re.findall(r"\.param \.[ubs](64|32)", params)]


def test_build_refuses_a_bad_arch_list(tmp_path):
    proc = _run("build", "--arch", "9x", "--out", str(tmp_path))
    assert proc.returncode == 2 and "--arch takes compute capabilities" in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given where there is no GPU")
def test_check_without_a_gpu_says_so_and_fails():
    proc = _run("check", timeout=120)
    assert proc.returncode == 1
    assert "needs a CUDA GPU" in proc.stderr
