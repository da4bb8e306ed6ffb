"""The tracked tree travels whole to a GPU machine, which carries at most 64 MiB: keep it at or under 40 MB so a
check has room for what it builds. Big files belong in a compact form (drafts in int8, the corpus index as uint16
tokens, the regenerated data gzip-compressed) or outside the repository."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from deepspec.paths import repo_root

MAX_TRACKED_BYTES = 40_000_000


def tracked_file_sizes() -> dict[str, int]:
    """{path: bytes} of every file git tracks in this checkout (what a copy of the repository carries)."""
    root = repo_root()
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout: nothing to measure")
    names = subprocess.run(["git", "ls-files", "-z"], cwd=root, check=True, capture_output=True).stdout
    sizes = {}
    for name in names.decode().split("\0"):
        path = root / name
        if name and path.is_file() and not path.is_symlink():
            sizes[name] = path.stat().st_size
    return sizes


def test_the_tracked_tree_fits_in_40_mb():
    sizes = tracked_file_sizes()
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda item: -item[1])[:8]
    listing = ", ".join(f"{name} {size / 1e6:.1f} MB" for name, size in largest)
    assert total <= MAX_TRACKED_BYTES, (
        f"the tracked tree is {total / 1e6:.1f} MB, over {MAX_TRACKED_BYTES / 1e6:.0f} MB; largest: {listing}"
    )
