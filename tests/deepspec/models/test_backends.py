"""The inference backends' registry (deepspec/models/backends.py): one record per backend with its availability
check, its loader and the weight formats it honours; its names are spelled there and nowhere else."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from deepspec.models import backends
from deepspec.models.backends import (
    AUTO,
    NATIVE,
    ONNX,
    PYTORCH,
    InferenceBackend,
    available_backends,
    backend_choices,
    check_backend_choice,
    register_backend,
    resolve_backend,
)

ROOT = Path(backends.__file__).resolve().parents[2]


def test_the_builtin_backends_and_the_choices_a_flag_offers():
    assert available_backends() == [PYTORCH, ONNX, NATIVE]
    assert backend_choices() == (PYTORCH, ONNX, NATIVE, AUTO)
    assert backend_choices(without=(ONNX,)) == (PYTORCH, NATIVE, AUTO)
    assert all(resolve_backend(name).name == name for name in available_backends())


def test_an_unknown_name_lists_the_registered_ones():
    with pytest.raises(
        KeyError,
        match=r"unknown inference backend 'tensorrt'; available: \['pytorch', 'onnx', "
        r"'native'\] or auto",
    ):
        resolve_backend("tensorrt")
    with pytest.raises(ValueError, match="unknown backend 'gpu'; choose one of pytorch, onnx, native, auto"):
        check_backend_choice("gpu")
    assert check_backend_choice(AUTO) == AUTO


def test_a_name_registers_once_and_auto_is_reserved():
    with pytest.raises(ValueError, match="already registered"):
        register_backend(resolve_backend(PYTORCH))
    with pytest.raises(ValueError, match="already registered"):
        register_backend(InferenceBackend(AUTO, "", lambda device: None, lambda spec, **options: None))


def test_availability_says_why_not():
    assert resolve_backend(PYTORCH).unavailable("cpu") is None
    assert resolve_backend(ONNX).unavailable("cuda") == "it runs on CPU only (--device cuda)"
    assert resolve_backend(NATIVE).unavailable("cuda") == "it runs on CPU only (--device cuda)"


def test_without_a_compiler_the_native_backend_names_the_missing_compiler(monkeypatch, tmp_path):
    from deepspec.models.native import build

    monkeypatch.setattr(build, "_LIBRARY", None)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("DEEPSPEC_CACHE_DIR", str(tmp_path / "cache"))
    reason = resolve_backend(NATIVE).unavailable("cpu")
    assert reason and "\n" not in reason


@pytest.mark.parametrize(
    "backend, refused", [(PYTORCH, "int8"), (PYTORCH, "int4"), (NATIVE, "none"), (NATIVE, "gguf"), (ONNX, "gguf")]
)
def test_a_weight_format_that_does_not_apply_is_refused(backend, refused):
    with pytest.raises(ValueError, match=f"weight format '{refused}' does not apply to the {backend} backend"):
        resolve_backend(backend).check_weight_format(refused)
    with pytest.raises(ValueError, match="unknown weight format 'fp4'"):
        resolve_backend(backend).check_weight_format("fp4")
    resolve_backend(backend).check_weight_format(AUTO)


def test_the_onnx_backend_loads_only_a_bundle(tmp_path):
    with pytest.raises(ValueError, match="the onnx backend runs an onnx bundle"):
        resolve_backend(ONNX).load(str(tmp_path))


def _backend_name_tables(tree: ast.AST) -> list[int]:
    """Lines of a tuple, list or Literal that spells two or more backend names as string constants."""
    names = set(available_backends())
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Tuple, ast.List, ast.Set)):  # a Literal's names are a Tuple too
            continue
        spelled = {e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names}
        if len(spelled) >= 2:
            found.append(node.lineno)
    return found


def test_the_backend_names_are_spelled_in_the_registry_only():
    """Was: Literal["auto", "pytorch", "onnx", "native"] in the worker, choices=[...] in the training and bench
    command lines, a tuple in training/prepare.py."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for folder in ("deepspec", "service", "export", "training", "bench", "loadtest")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != Path(backends.__file__).resolve()
        for line in _backend_name_tables(ast.parse(path.read_text(), str(path)))
    ]
    assert not offenders, offenders


def test_the_table_scan_sees_a_choices_list_and_a_literal():  # negative control
    tree = ast.parse(
        'choices=["auto", "native", "pytorch"]\nEngine = Literal["auto", "pytorch", "onnx"]\n'
        'x = ("pytorch",)\nformats = ("onnx", "vllm")\n'
    )
    assert _backend_name_tables(tree) == [1, 2]
