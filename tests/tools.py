"""Where the external tools the tests run (promtool, prometheus, hadolint, checkov) are found.

`make test` and `make test-fast` install every one of them (`make system-deps`), so a missing tool fails the test
with the command that installs it: a skip would let a check that never ran pass."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


def require_tool(name: str, *candidates: Path, how: str) -> str:
    """Path of `name`: the first existing candidate, else the one on PATH; `how` says what installs it."""
    path = next((str(p) for p in candidates if p.exists()), None) or shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: {how}")
    return path
