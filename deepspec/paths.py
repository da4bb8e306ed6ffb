"""Where things live: heavy, re-creatable files in `~/.cache/deepspec` (or `$DEEPSPEC_CACHE_DIR`); the prompt sets
in the checkout's `datasets/` (or `$DEEPSPEC_DATASETS_DIR`)."""

import os
from pathlib import Path


def cache_dir() -> Path:
    """The base cache directory (created on first use); override with DEEPSPEC_CACHE_DIR."""
    base = Path(os.environ.get("DEEPSPEC_CACHE_DIR") or Path.home() / ".cache" / "deepspec")
    base.mkdir(parents=True, exist_ok=True)
    return base


def repo_root() -> Path:
    """The checkout this package runs from (drafts/, bench/ and datasets/ beside it)."""
    return Path(__file__).resolve().parent.parent


def datasets_dir() -> Path:
    """The prompt sets, `eval/*.jsonl` and `train/*.jsonl` (datasets/README.md names their sources and licences).

    `<checkout>/datasets`, shipped with the repository; DEEPSPEC_DATASETS_DIR points at another folder with the
    same layout (tests use it to serve small fakes)."""
    override = os.environ.get("DEEPSPEC_DATASETS_DIR")
    return Path(override) if override else repo_root() / "datasets"


def eval_dataset(name: str) -> Path:
    """`<datasets>/eval/<name>.jsonl`, a benchmark prompt set such as `humaneval` (never trained on)."""
    return datasets_dir() / "eval" / f"{name}.jsonl"

