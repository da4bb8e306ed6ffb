"""Where the external tools the tests run (promtool, prometheus, hadolint, checkov) are found.

`make test` installs every one of them, so a missing tool fails the run on CI (CI=true) and is a skip only on a
developer's machine that has not run `make system-deps`."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def require_tool(name: str, *candidates: Path, how: str) -> str:
    """Path of `name`: the first existing candidate, else the one on PATH; `how` says what installs it."""
    path = next((str(p) for p in candidates if p.exists()), None) or shutil.which(name)
    if path is None:
        message = f"{name} not found: {how}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path
