"""bench.gpu_check on a CPU: every part at tiny sizes (so the GPU script cannot rot between GPU runs), with the
modules the GPU machine lacks made unimportable; the runner's isolation (a crash, a hang, a missing module cost one
part); the offline wheel install; and the Makefile target that installs nothing but this package."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from bench.gpu_check import runner
from bench.gpu_check.context import Context, guarded
from bench.gpu_check.environment import install_wheels, wheels_to_install
from bench.gpu_check.report import FAIL, OK, SKIPPED, Row
from bench.gpu_check.sizes import QUICK

ROOT = Path(__file__).resolve().parents[2]
#: importable here, absent on the GPU machine (torch 2.11 + CUDA 13 stack, no network): the check must not need them
ABSENT_ON_GPU_MACHINE = (
    "gguf",
    "fastapi",
    "uvicorn",
    "pydantic_settings",
    "onnxruntime_extensions",
    "onnxscript",
    "matplotlib",
    "scipy",
    "aiohttp",
    "openai",
    "datasets",
    "speculators",
    "locust",
)
DRAFTERS = [
    "prompt-lookup",
    "corpus chain",
    "corpus tree",
    "dflash chain",
    "dflash tree",
    "dspark chain",
    "dspark tree",
    "eagle3 chain",
    "eagle3 tree",
    "hybrid corpus+dspark",
]


def _site_without(absent: tuple[str, ...], farm: Path) -> Path:
    """A directory of links to every entry of this environment's site-packages except the distributions in
    `absent` (their modules, dist-info and bundled libraries), so neither an import nor a metadata lookup finds
    them, as on the GPU machine."""
    import sysconfig

    site = Path(sysconfig.get_paths()["purelib"])
    farm.mkdir()
    for entry in site.iterdir():
        if entry.name.split("-")[0].split(".")[0].lower() not in absent:
            (farm / entry.name).symlink_to(entry)
    return farm


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One `--device cpu --quick` run of every part in one process that cannot see what the GPU machine lacks."""
    tmp = tmp_path_factory.mktemp("gpu-check")
    out = tmp / "gpu_check.json"
    site = _site_without(ABSENT_ON_GPU_MACHINE, tmp / "site-packages")
    # as on the GPU machine: no TRITON_INTERPRET (tests/plugins/test_kernels.py sets it in the process it shares
    # with other test files), so the kernels part compiles them instead of interpreting
    env = {
        **{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"},
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)]),
    }
    # -S: no site-packages but the filtered copy on PYTHONPATH
    proc = subprocess.run(
        [
            sys.executable,
            "-S",
            "-m",
            "bench.gpu_check",
            "--device",
            "cpu",
            "--quick",
            "--in-process",
            "--out",
            str(out),
            "--workdir",
            str(tmp / "work"),
            "--wheels",
            str(tmp / "no-wheels"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc, json.loads(out.read_text()) if out.is_file() else None


def _part(report: dict, name: str) -> dict:
    return next(p for p in report["parts"] if p["part"] == name)


def _rows(report: dict, name: str) -> dict[str, dict]:
    return {r["item"]: r for r in _part(report, name)["rows"]}


def test_every_part_runs_and_passes_at_quick_sizes(quick_run):
    proc, report = quick_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    parts = ["setup", "kernels", "engine", "training", "onnx", "tensorrt", "vllm"]
    assert [p["part"] for p in report["parts"]] == parts
    assert report["failed"] == [] and report["sizes"]["name"] == "quick" and report["complete"]
    for part in parts:
        assert f"\n{part} " in proc.stdout  # the printed table has a line per part


def test_every_drafter_chain_and_tree_decodes_greedy_identical_to_target_only(quick_run):
    rows = _rows(quick_run[1], "engine")
    assert list(rows) == ["target-only", "hf-generate fp32 greedy", "hf-generate bf16 batch 1", *DRAFTERS]
    for label in DRAFTERS:
        assert rows[label]["status"] == OK and rows[label]["detail"] == "greedy identical to target-only", rows[label]
        assert rows[label]["metrics"]["bf16_tok_s"] > 0 and rows[label]["metrics"]["acceptance_length"] >= 1
        assert rows[label]["metrics"]["draft_tokens"] > 0  # drafts were proposed and verified (at these seeds)
    # the corpus indexes the reference answers: its drafts are accepted, so the accept path really ran
    assert rows["corpus chain"]["metrics"]["acceptance_length"] > 1.5
    assert rows["hf-generate fp32 greedy"]["detail"] == "identical to our target-only"


def test_kernels_compile_and_skip_the_launch_without_a_gpu_saying_why(quick_run):
    rows = _rows(quick_run[1], "kernels")
    assert (
        rows["compile greedy_accept_kernel"]["status"] == OK
        and "sm_90" in rows["compile greedy_accept_kernel"]["detail"]
    )
    assert (
        rows["kernels vs reference"]["status"] == SKIPPED and "no CUDA device" in rows["kernels vs reference"]["detail"]
    )


def test_training_steps_of_each_algorithm_and_the_onnx_export(quick_run):
    train = _rows(quick_run[1], "training")
    assert list(train) == ["train dflash", "train dspark", "train eagle3"]
    assert all(r["status"] == OK and r["metrics"]["steps"] == QUICK.num_train_steps for r in train.values())
    onnx = _rows(quick_run[1], "onnx")
    assert onnx["prefill logits on CPUExecutionProvider"]["status"] == OK
    assert onnx["prefill logits on CPUExecutionProvider"]["metrics"]["argmax_agree"] == 1.0
    cuda = onnx["prefill logits on CUDAExecutionProvider"]
    assert cuda["status"] == SKIPPED and cuda["detail"]  # a CPU build, or no CUDA device: the reason is written


def _context(tmp_path, budget: float = 60) -> Context:
    sizes = QUICK.__class__(**{**QUICK.as_dict(), "budget_seconds": {name: budget for name in runner.PARTS}})
    return Context("cpu", sizes, tmp_path, tmp_path / "target")


def test_a_crashed_or_hung_part_fails_alone_with_the_reason(tmp_path, monkeypatch):
    crash = runner.run_part(
        "kernels",
        _context(tmp_path),
        [],
        command=[sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
        log=lambda line: None,
    )
    assert crash.status == FAIL and crash.detail.startswith("crashed: signal 9 (SIGKILL)")
    monkeypatch.setattr(runner, "GRACE_SECONDS", 0)
    hung = runner.run_part(
        "kernels",
        _context(tmp_path, budget=1),
        [],
        command=[sys.executable, "-c", "import time; time.sleep(60)"],
        log=lambda line: None,
    )
    assert hung.status == FAIL and hung.detail.startswith("killed after 1 s")
    late = runner.run_part("kernels", _context(tmp_path), [], deadline=time.perf_counter(), log=lambda line: None)
    assert late.status == SKIPPED and "total time budget" in late.detail


def test_a_part_whose_module_is_missing_is_skipped_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setitem(runner.PART_MODULES, "onnx", ("onnx", "no_such_module_for_the_check"))
    result = runner.run_part("onnx", _context(tmp_path), [], log=lambda line: None)
    assert result.status == SKIPPED and "missing modules: no_such_module_for_the_check" in result.detail
    assert "make gpu-wheels" in result.detail


def test_guarded_rows_report_the_exception_and_a_spent_budget(tmp_path):
    def boom():
        raise RuntimeError("kernel fault")

    assert guarded(_context(tmp_path), "x", boom) == [Row("x", FAIL, "RuntimeError: kernel fault")]
    assert guarded(_context(tmp_path), "x", lambda: [Row("x", OK)]) == [Row("x", OK)]
    context = _context(tmp_path)
    context.part_budget_seconds = 0.0
    spent = guarded(context, "x", lambda: [Row("x", OK)])
    assert spent[0].status == SKIPPED and "budget" in spent[0].detail


def _wheel(directory: Path, name: str, version: str, module_text: str = "") -> Path:
    """A minimal pure-Python wheel (one module, dist-info with METADATA, WHEEL and RECORD)."""
    dist = f"{name}-{version}.dist-info"
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}.py", module_text)
        z.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", f"{name}.py,,\n{dist}/METADATA,,\n{dist}/WHEEL,,\n{dist}/RECORD,,\n")
    return path


def test_wheels_install_offline_only_where_the_machine_lacks_the_package(tmp_path, monkeypatch):
    import numpy

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "gpu_check_probe", "1.0", "VALUE = 42\n")
    _wheel(wheels, "numpy", "1.0")  # older than the installed numpy: never replaces it
    assert [w.name for w in wheels_to_install(wheels)] == ["gpu_check_probe-1.0-py3-none-any.whl"]
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "")
    site = tmp_path / "site"
    assert install_wheels(wheels, site, log=lambda line: None) == ["gpu_check_probe-1.0-py3-none-any.whl"]
    assert sys.path[0] == str(site) and os.environ["PYTHONPATH"] == str(site)
    assert (site / "gpu_check_probe.py").is_file() and not (site / "numpy").exists()
    gpu_check_probe = importlib.import_module("gpu_check_probe")  # the wheel just installed

    assert gpu_check_probe.VALUE == 42 and numpy.__file__ != str(site)
    monkeypatch.delitem(sys.modules, "gpu_check_probe")


def test_make_gpu_check_installs_only_this_package_without_dependencies():
    recipe = subprocess.run(
        ["make", "-n", "gpu-check", "GPU_PYTHON=python3"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    installs = [line for line in recipe.splitlines() if "pip install" in line]
    assert len(installs) == 1 and "--no-deps" in installs[0] and "--no-index" in installs[0]
    assert installs[0].split("pip install", 1)[1].split("||")[0].split()[-2:] == ["-e", "."]
    assert "python3 -m bench.gpu_check" in recipe
    ignored = subprocess.run(
        ["git", "check-ignore", "bench/results/gpu_check.json", ".whl/x.whl"], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    assert ignored == ["bench/results/gpu_check.json", ".whl/x.whl"]


def test_full_sizes_fit_eight_minutes_and_the_real_target_shapes():
    """Each part's budget fits inside the whole check's limit, which leaves room for `make`'s install and the
    imports within 8 minutes; FULL's target is SmolLM2-135M's config (30 layers, hidden 576, 9 heads, 3 kv heads,
    vocab 49152)."""
    from bench.gpu_check.sizes import FULL

    for sizes in (FULL, QUICK):
        assert set(sizes.budget_seconds) == set(runner.PARTS)
    assert sum(FULL.budget_seconds.values()) <= FULL.total_seconds <= 8 * 60 - 30
    assert {
        k: FULL.target[k]
        for k in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size")
    } == {
        "num_hidden_layers": 30,
        "hidden_size": 576,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "vocab_size": 49152,
    }
    assert FULL.num_train_steps == 20


def test_tensorrt_part_checks_the_aot_contract_and_skips_the_engine_without_a_gpu(quick_run):
    """Issue 42 item 10, the CPU half: the installed triton's greedy_accept PTX, after plugins.aot.tensorrt_ptx,
    declares the 7 parameters TensorRT's AOT launch passes; building and running the engine waits for a GPU."""
    rows = _rows(quick_run[1], "tensorrt")
    contract = rows["AOT contract greedy_accept"]
    assert contract["status"] == OK and contract["metrics"]["launched_params"] == 7, contract
    engine = rows["TensorRT engine deepspec::greedy_accept"]
    assert engine["status"] == SKIPPED and engine["detail"]


def test_vllm_part_exports_a_qwen3_draft_and_skips_serving_without_a_gpu(quick_run):
    """Issue 42 item 11, the CPU half: a q/k-norm (Qwen3) EAGLE-3 draft goes out in the speculators format with a
    qwen3 layer config; vLLM loading it waits for a GPU."""
    rows = _rows(quick_run[1], "vllm")
    exported = rows["export qwen3 q/k-norm eagle3 (speculators)"]
    assert exported["status"] == OK and "model_type qwen3" in exported["detail"], exported
    served = rows["vllm serves the speculators draft"]
    assert served["status"] == SKIPPED and served["detail"]
