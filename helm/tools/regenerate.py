"""The command line the chart's generators share: write their files, or with `--check` fail when the committed ones
are stale (the tests run the check, so a hand edit of generated JSON or a forgotten rerun is caught).
Standard library only."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def regenerate(render: Callable[[], dict[Path, str]], argv: list[str] | None, description: str, script: str) -> int:
    """Write every `path -> text` that `render` returns; with --check write nothing and return 1 if any differs."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", action="store_true", help="fail if the committed files differ")
    args = parser.parse_args(argv)
    stale = []
    for path, text in render().items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"stale (run python {script}):", *stale, sep="\n  ", file=sys.stderr)
        return 1
    return 0
