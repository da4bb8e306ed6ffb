"""Write into a scratch directory beside --out and rename it into place at the end.

An interrupted or refused export leaves --out exactly as it was: a reader (the worker, the chart's init container)
sees either no manifest.json or a complete directory, never half of one.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

from export.errors import ExportError


def check_out(out: Path, force: bool) -> None:
    """Refuse an existing, non-empty --out unless --force (before any work is done)."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ExportError(f"--out {out} exists and is not empty; pass --force to replace it")


@contextlib.contextmanager
def staged(out: Path, force: bool):
    """Yield an empty scratch directory; on success it replaces `out`, on any error it is removed."""
    check_out(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    try:
        yield scratch
        old = None
        if out.exists():
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
            out.rename(old / "out")
        scratch.rename(out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
