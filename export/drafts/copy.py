"""Copy a draft directory into an export so the copy stands on its own.

A neural draft or a corpus-lookup index is its files. A hybrid names two other draft directories relative to
itself (`../smollm2-135m-corpus`); copied as it is, those paths would point outside the export. Its parts go inside
the copy instead (`draft/corpus/`, `draft/neural/`) and its config.json names them there, so the worker loads the
copy exactly as it loads the shipped hybrid.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from export.sources import HYBRID, DraftSource


def _plan(draft: DraftSource, dest: Path) -> list[tuple[Path, Path]]:
    """(source file, destination file) of every file the copy holds; a hybrid's config.json is written, not copied."""
    files = [(f, dest / f.name) for f in draft.files() if not (draft.algo == HYBRID and f.name == "config.json")]
    for part, source in draft.parts.items():
        files += _plan(source, dest / part)
    return files


def copy_draft(draft: DraftSource, dest: Path, progress) -> None:
    """Copy `draft` into the new directory `dest`, under a progress bar."""
    files = _plan(draft, dest)
    with progress.task("copying the draft", total=len(files)) as advance:
        for source, target in files:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
            advance(1)
    if draft.algo == HYBRID:
        config = {**draft.header, **{part: part for part in draft.parts}}
        (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
