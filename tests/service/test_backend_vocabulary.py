"""One vocabulary (issue 43 item 3): the worker's inference backend is `--backend` (DEEPSPEC_WORKER_BACKEND) and an
export's folder a bundle (`--bundle-dir`); the old `--engine` / `--engine-dir` and their variables still work, with
a FutureWarning naming the new name. The one weight-format option (`--quantization`) is refused where the backend
named does not take it instead of being ignored (the native backend ignored it); with `--backend auto` it applies."""

from __future__ import annotations

import os

import pytest

from service.cli import parse_config
from service.worker.settings import WorkerSettings
from tests.service.conftest import worker_of


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in os.environ:
        if name.startswith("DEEPSPEC_WORKER_"):
            monkeypatch.delenv(name)


def test_backend_is_the_flag_and_the_variable(monkeypatch):
    assert worker_of(parse_config(["worker", "--backend", "native"])).backend == "native"
    monkeypatch.setenv("DEEPSPEC_WORKER_BACKEND", "onnx")
    assert worker_of(parse_config(["worker"])).backend == "onnx"


def test_the_old_engine_flag_still_works_and_names_the_new_one():
    with pytest.warns(
        FutureWarning, match="--engine / DEEPSPEC_WORKER_ENGINE is deprecated: use --backend / DEEPSPEC_WORKER_BACKEND"
    ):
        worker = worker_of(parse_config(["worker", "--engine", "pytorch"]))
    assert (worker.backend, worker.engine) == ("pytorch", None)


def test_the_old_engine_variable_still_works(monkeypatch):
    monkeypatch.setenv("DEEPSPEC_WORKER_ENGINE", "native")
    with pytest.warns(FutureWarning, match="use --backend"):
        assert worker_of(parse_config(["worker"])).backend == "native"


def test_old_and_new_names_that_disagree_are_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_config(["worker", "--engine", "pytorch", "--backend", "native"])
    assert exit_info.value.code == 2
    assert "deprecated name of --backend: give only the new one" in capsys.readouterr().err


def test_the_old_engine_dir_flag_is_the_bundle_dir(tmp_path):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "manifest.json").write_text(
        '{"format": "pytorch", "target": "stub", "draft": "none", "dtype": "float32"}'
    )
    with pytest.warns(
        FutureWarning,
        match="--engine-dir / DEEPSPEC_WORKER_ENGINE_DIR is deprecated: use --bundle-dir / DEEPSPEC_WORKER_BUNDLE_DIR",
    ):
        worker = worker_of(parse_config(["worker", "--engine-dir", str(bundle)]))
    assert worker.bundle_dir == bundle and worker.target == "stub" and worker.engine_dir is None
    assert worker_of(parse_config(["worker", "--bundle-dir", str(bundle)])).draft == "none"


@pytest.mark.parametrize(
    "backend, weights",
    [("native", "none"), ("native", "gguf"), ("pytorch", "int8"), ("pytorch", "int4"), ("onnx", "gguf")],
)
def test_a_weight_format_the_backend_does_not_take_is_refused(backend, weights, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_config(["worker", "--backend", backend, "--quantization", weights])
    assert exit_info.value.code == 2
    assert f"weight format '{weights}' does not apply to the {backend} backend" in capsys.readouterr().err


@pytest.mark.parametrize(
    "backend, weights",
    [
        ("native", "int8"),
        ("native", "int4"),
        ("pytorch", "gguf"),
        ("pytorch", "none"),
        ("onnx", "int4"),
        ("onnx", "none"),
    ],
)
def test_a_weight_format_the_backend_takes_is_kept(backend, weights):
    assert worker_of(parse_config(["worker", "--backend", backend, "--quantization", weights])).quantization == weights


@pytest.mark.parametrize("weights", ["none", "gguf", "int8", "int4"])
def test_with_backend_auto_every_weight_format_applies(weights):
    """Auto weighs only the backends that honour the format (tests/service/test_fastest_backend.py)."""
    worker = worker_of(parse_config(["worker", "--quantization", weights]))
    assert (worker.backend, worker.quantization) == ("auto", weights)
    assert WorkerSettings().quantization == "auto" and WorkerSettings(target="stub", quantization="int8")
