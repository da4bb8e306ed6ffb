"""The wheel is the product (issue 43 item 1): built with `pip wheel .`, installed into a fresh venv outside the
checkout, it serves a request with the native backend and the shipped corpus draft, finds the shipped drafts for
`--draft auto`, and every stage's `--help` runs through the `deepspec` console script.

The fresh venv gets the wheel alone (`pip install --no-deps`); its dependencies come from the test's own environment
through a `.pth` file naming that environment's site-packages. That keeps the test offline and seconds long (no
resolver, no download of torch) while the package itself is only the wheel's copy: a `.pth` line adds a folder to
sys.path after the venv's own site-packages, and the `.pth` files inside that folder (the checkout's editable
install among them) are not run, so `import deepspec` finds the installed wheel or nothing. The test asserts which.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
#: what `make serve` reads from the checkout, as the wheel must carry it
MUST_SHIP = (
    "deepspec/models/native/decoder.c",
    "deepspec/_shipped/drafts/smollm2-135m-corpus/config.json",
    "deepspec/_shipped/drafts/smollm2-135m-corpus/eval.json",
    "deepspec/_shipped/datasets/train/codealpaca.jsonl.gz",  # the engine choice's calibration prompts
    "deepspec/_shipped/datasets/train/gsm8k_train.jsonl.gz",
    "deepspec_protocol/protos/deepspec/v1/completions.proto",
    "deepspec_protocol/protos/deepspec/v1/completions_pb2.py",
    "loadtest/prompts/humaneval.jsonl",
    "training/configs/smollm2-135m-eagle3-canonical.yaml",
)
STAGES = ("serve", "worker", "gateway", "train", "export", "loadtest", "plugins")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(REPO), "-w", str(out)],
        check=True,
        timeout=600,
        cwd=out,
    )
    return next(out.glob("deepspec-*.whl"))


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv (outside the checkout) holding the wheel; returns its bin/ folder."""
    venv = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
        check=True,
        timeout=600,
    )
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    deps = [sysconfig.get_paths()["purelib"], *site.getsitepackages()]
    (Path(purelib) / "_deepspec_test_deps.pth").write_text("\n".join(dict.fromkeys(deps)) + "\n")
    return venv / "bin"


def _env() -> dict:
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DEEPSPEC_DRAFTS_DIR", "DEEPSPEC_DATASETS_DIR")
    }
    return {**env, "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1")}


def _run(bin_dir: Path, *args: str, cwd: Path, timeout: float = 300) -> str:
    result = subprocess.run(
        [str(bin_dir / args[0]), *args[1:]], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{args}: {result.stderr[-3000:]}"
    return result.stdout


def test_the_wheel_carries_what_make_serve_reads(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [n for n in MUST_SHIP if n not in names]
    assert not missing, missing
    scripts = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "deepspec = deepspec.cli:main" in scripts


@pytest.mark.slow
def test_the_installed_package_is_the_wheels_and_finds_its_data(installed, tmp_path):
    probe = (
        "import deepspec, service, json\n"
        "from deepspec.paths import datasets_dir\n"
        "from deepspec.models.drafts import shipped_drafts_dir\n"
        "from deepspec.models.native.build import SOURCE\n"
        "print(json.dumps([deepspec.__file__, service.__file__, str(shipped_drafts_dir()), str(datasets_dir()),"
        " SOURCE.is_file(), sorted(p.parent.name for p in shipped_drafts_dir().glob('*/config.json'))]))"
    )
    import json

    files = json.loads(_run(installed, "python", "-c", probe, cwd=tmp_path))
    root = installed.parent
    for path in files[:4]:
        assert Path(path).resolve().is_relative_to(root.resolve()), path  # the wheel's copy, not the checkout
    assert files[4], "decoder.c is not beside the installed native backend"
    assert "smollm2-135m-corpus" in files[5] and "smollm2-135m-eagle3" in files[5]


@pytest.mark.slow
def test_every_stage_answers_help_through_the_console_script(installed, tmp_path):
    assert "commands:" in _run(installed, "deepspec", "--help", cwd=tmp_path)
    for stage in STAGES:
        assert "usage:" in _run(installed, "deepspec", stage, "--help", cwd=tmp_path), stage
    for module in ("service", "training", "export", "loadtest"):  # python -m <stage> stays
        assert "usage:" in _run(installed, "python", "-m", module, "--help", cwd=tmp_path), module


@pytest.mark.slow
@pytest.mark.integration
def test_the_installed_wheel_serves_with_the_native_backend_and_the_corpus_draft(installed, tmp_path):
    site_packages = next((installed.parent / "lib").glob("python3*/site-packages"))
    draft = site_packages / "deepspec" / "_shipped" / "drafts" / "smollm2-135m-corpus"
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                str(installed / "deepspec"),
                "serve",
                "--backend",
                "native",
                "--draft",
                str(draft),
                "--http-port",
                str(port),
                "--grpc-port",
                "-1",
                "--metrics-port",
                "-1",
                "--max-batch-size",
                "1",
            ],
            cwd=tmp_path,
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_ready(proc, port, log)
        body = {"model": "smollm2-135m", "prompt": "def fib(n):", "max_tokens": 16, "temperature": 0}
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=300).json()
        assert reply["usage"]["completion_tokens"] == 16 and reply["choices"][0]["text"], reply
        text = log.read_text()
        assert "backend: native" in text and "drafter corpus-lookup" in text, text[-3000:]
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _wait_ready(proc: subprocess.Popen, port: int, log: Path, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"deepspec serve exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"deepspec serve not ready after {timeout_s} s:\n{log.read_text()[-4000:]}")
