"""Where things live: heavy, re-creatable files in `~/.cache/deepspec` (or `$DEEPSPEC_CACHE_DIR`); the shipped drafts
and prompt sets in the package's `_shipped/` folder (or `$DEEPSPEC_DRAFTS_DIR`, `$DEEPSPEC_DATASETS_DIR`).

`deepspec/_shipped/drafts` and `deepspec/_shipped/datasets` are symbolic links to the checkout's `drafts/` and
`datasets/`: a checkout and an editable install read the folders in place, and `pip wheel .` copies their files into
the wheel as package data (setuptools follows the links), so an installed package finds the same drafts and prompts
with no checkout beside it. The paths handed out are resolved: in a checkout, the checkout's own folders."""

import logging
import os
from functools import cache
from pathlib import Path

logger = logging.getLogger(__name__)

#: the package's shipped data: drafts/ and datasets/ (links in a checkout, real folders in an installed wheel)
SHIPPED = Path(__file__).resolve().parent / "_shipped"


def cache_dir() -> Path:
    """The base cache directory (created on first use); override with DEEPSPEC_CACHE_DIR."""
    base = Path(os.environ.get("DEEPSPEC_CACHE_DIR") or Path.home() / ".cache" / "deepspec")
    base.mkdir(parents=True, exist_ok=True)
    return base


def repo_root() -> Path:
    """The checkout this package runs from (drafts/, bench/ and datasets/ beside it); in an installed wheel, the
    site-packages folder, which holds none of them: read shipped data through `drafts_dir` and `datasets_dir`."""
    return Path(__file__).resolve().parent.parent


def datasets_dir() -> Path:
    """The prompt sets, `eval/*.jsonl` and `train/*.jsonl` (datasets/README.md names their sources and licences).

    The shipped ones (the checkout's `datasets/`, package data in a wheel); DEEPSPEC_DATASETS_DIR points at another
    folder with the same layout (tests use it to serve small fakes)."""
    override = os.environ.get("DEEPSPEC_DATASETS_DIR")
    return Path(override) if override else (SHIPPED / "datasets").resolve()


def drafts_dir() -> Path:
    """The drafts `--draft auto` chooses from: one folder per draft, each with its config.json and eval.json.

    The shipped ones (the checkout's `drafts/`, package data in a wheel); DEEPSPEC_DRAFTS_DIR points at another
    folder (a volume of drafts trained elsewhere). A folder that holds no draft is logged as a warning, once: `auto`
    then serves the target alone, which must not pass unnoticed."""
    override = os.environ.get("DEEPSPEC_DRAFTS_DIR")
    path = Path(override) if override else (SHIPPED / "drafts").resolve()
    _warn_if_no_drafts(path, "DEEPSPEC_DRAFTS_DIR" if override else "the package's shipped drafts")
    return path


@cache
def _warn_if_no_drafts(path: Path, source: str) -> None:
    if not any(path.glob("*/config.json")):
        logger.warning(
            "no drafts in %s (%s): --draft auto will serve the target alone. Set DEEPSPEC_DRAFTS_DIR to a "
            "folder of drafts (one folder each, with config.json), or reinstall the deepspec wheel, which "
            "ships them",
            path,
            source,
        )


def eval_dataset(name: str) -> Path:
    """`<datasets>/eval/<name>.jsonl`, a benchmark prompt set such as `humaneval` (never trained on)."""
    return datasets_dir() / "eval" / f"{name}.jsonl"
