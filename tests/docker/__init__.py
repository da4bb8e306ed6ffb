"""Tests of docker/: its scripts are files, not a package, so the tests load them by path (`load_script`)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load_script(name: str, path: Path):
    """The module at `path` (a script of docker/ or helm/tools/), imported under `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, f"{path} is not a Python file"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
