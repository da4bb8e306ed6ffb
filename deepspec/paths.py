"""Where heavy, re-creatable things live: `~/.cache/deepspec`, or `$DEEPSPEC_CACHE_DIR`."""

import os
from pathlib import Path


def cache_dir() -> Path:
    """The base cache directory (created on first use); override with DEEPSPEC_CACHE_DIR."""
    base = Path(os.environ.get("DEEPSPEC_CACHE_DIR") or Path.home() / ".cache" / "deepspec")
    base.mkdir(parents=True, exist_ok=True)
    return base


def repo_root() -> Path:
    """The checkout this package runs from (drafts/, bench/ and the datasets beside it)."""
    return Path(__file__).resolve().parent.parent


def datasets_dir() -> Path:
    """`../shared/datasets` beside the checkout, or `$DEEPSPEC_DATASETS_DIR`."""
    override = os.environ.get("DEEPSPEC_DATASETS_DIR")
    return Path(override) if override else repo_root().parent / "shared" / "datasets"
