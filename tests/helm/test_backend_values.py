"""The chart's backend values (issue 43 item 3): `model.backend` names the worker's inference backend
(`--backend=$(DEEPSPEC_BACKEND)`), the old `model.engine` still renders, winning, with a deprecation note in NOTES,
a bundle is `--bundle-dir`, and a weight format the backend does not take fails the render, by the same table as
the worker's registry (deepspec/models/backends.py)."""

from __future__ import annotations

import pytest
from helm_python.errors import HelmError

from deepspec.models.backends import AUTO, available_backends, resolve_backend
from deepspec.models.quantization import WEIGHT_FORMATS
from tests.helm.conftest import container, one, render, render_files, workload


def _worker_args_and_config(values: dict) -> tuple[list[str], dict]:
    docs = render(values)
    return container(workload(docs, "worker")["spec"]["template"]["spec"], "worker")["args"], one(
        docs, "ConfigMap", "model"
    )["data"]


def test_the_backend_value_reaches_the_workers_backend_flag():
    args, config = _worker_args_and_config({"model": {"backend": "native"}})
    assert "--backend=$(DEEPSPEC_BACKEND)" in args and config["DEEPSPEC_BACKEND"] == "native"
    assert not any(a.startswith("--engine") for a in args) and "DEEPSPEC_ENGINE" not in config
    assert "DEPRECATED" not in render_files({"model": {"backend": "native"}})["deepspec/templates/NOTES.txt"]


def test_the_old_engine_value_still_renders_and_the_notes_say_to_rename_it():
    args, config = _worker_args_and_config({"model": {"engine": "onnx"}})
    assert config["DEEPSPEC_BACKEND"] == "onnx"
    notes = render_files({"model": {"engine": "onnx"}})["deepspec/templates/NOTES.txt"]
    assert "DEPRECATED: model.engine is now model.backend" in notes and "model.engine=onnx" in notes


@pytest.mark.parametrize("backend", [*available_backends(), AUTO])
def test_the_charts_weight_formats_per_backend_are_the_registrys(backend):
    takes = resolve_backend(backend).weight_formats if backend != AUTO else WEIGHT_FORMATS  # auto weighs those that do
    for weights in WEIGHT_FORMATS:
        values = {"model": {"backend": backend, "quantization": weights}}
        if weights in takes:
            assert _worker_args_and_config(values)[1]["DEEPSPEC_QUANTIZATION"] == weights
        else:
            with pytest.raises(
                HelmError, match=f"model.quantization={weights} does not apply to model.backend={backend}"
            ):
                render_files(values)
