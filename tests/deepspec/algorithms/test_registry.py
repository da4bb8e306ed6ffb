"""The draft algorithm registry (deepspec/algorithms): the built-in records name parts that exist and are of the
right kind, unknown names list the registered ones, and the package stays import-free (no torch, no stage)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from deepspec.algorithms import (
    DraftAlgorithm,
    available_algorithms,
    check_layout,
    load_part,
    register_algorithm,
    registry,
    resolve_algorithm,
)

BUILTINS = ["dflash", "dspark", "eagle3"]


def test_the_builtins_are_registered():
    assert available_algorithms() == BUILTINS


@pytest.mark.parametrize("name", BUILTINS)
def test_every_part_a_builtin_names_exists_and_is_what_its_layer_expects(name):
    """A typo in builtin.py's import paths, or a part of the wrong kind, fails here rather than in the one stage
    that loads it."""
    from deepspec.decoding.drafter import Drafter
    from deepspec.models.drafts.config import DraftConfig
    from deepspec.models.drafts.layers import DraftModel
    from export.job import DraftWriter

    algorithm = resolve_algorithm(name)
    assert issubclass(load_part(algorithm.module), DraftModel)
    assert issubclass(load_part(algorithm.drafter), Drafter) and load_part(algorithm.drafter).name == name
    assert issubclass(load_part(algorithm.config), DraftConfig)
    assert callable(load_part(algorithm.loss))
    assert algorithm.calibrate is None or callable(load_part(algorithm.calibrate))
    assert algorithm.export_writers and all(
        isinstance(load_part(w), DraftWriter) for w in algorithm.export_writers.values()
    )
    assert algorithm.onnx is not None and callable(load_part(algorithm.onnx.build))
    assert all(f.endswith(".onnx") for f in algorithm.onnx.files)


def test_unknown_names_list_the_registered_ones_and_duplicates_are_refused(monkeypatch):
    with pytest.raises(
        KeyError, match=r"unknown draft algorithm 'medusa'; available: \['dflash', 'dspark', 'eagle3'\]"
    ):
        resolve_algorithm("medusa")
    monkeypatch.setattr(registry, "_ALGORITHMS", dict(registry._ALGORITHMS))  # undone after the test
    with pytest.raises(ValueError, match="'eagle3' is already registered"):
        register_algorithm(resolve_algorithm("eagle3"))
    with pytest.raises(ValueError, match="plain name"):
        DraftAlgorithm(name="my:algo", module=object, drafter=object, loss=print)


def test_a_layout_belongs_to_its_algorithm():
    check_layout("eagle3", "canonical")
    with pytest.raises(ValueError, match=r"dflash drafts have no layout 'canonical' \(it is the eagle3 layout\)"):
        check_layout("dflash", "canonical")
    with pytest.raises(ValueError, match=r"unknown eagle3 layout 'sglang'; available: \['deepspec', 'canonical'\]"):
        check_layout("eagle3", "sglang")


def test_a_part_is_an_object_or_an_import_path():
    assert load_part("deepspec.algorithms.registry:resolve_algorithm") is resolve_algorithm
    assert load_part(print) is print
    with pytest.raises(ValueError, match="package.module:attribute"):
        load_part("deepspec.algorithms.registry.resolve_algorithm")


def test_the_registry_imports_no_layer_it_names():
    """Resolving the records loads neither torch nor any stage: the model layer below them never imports upward,
    and `python -m training train --help` lists the algorithms at once."""
    code = (
        "import sys\nfrom deepspec.algorithms import available_algorithms, resolve_algorithm\n"
        "[resolve_algorithm(a) for a in available_algorithms()]\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'training', 'export', 'service'}), "
        "sorted(m for m in sys.modules if m.startswith('deepspec.') and not m.startswith('deepspec.algorithms')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] []", out.stdout
