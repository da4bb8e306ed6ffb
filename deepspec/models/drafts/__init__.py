"""Draft architectures (Eagle3, DFlash, DSpark), their checkpoints, and the shipped drafts.

Which algorithms exist and which module and config class each builds is their record (deepspec/algorithms:
`resolve_algorithm(cfg.algo)`); this package reads and writes draft *directories*. Turning one into the engine's
Drafter is the job of the drafter registry in deepspec.decoding (`build_drafter("<draft dir>" | "auto", target)`),
which sits above this layer: nothing here imports deepspec.decoding. A draft directory may also hold a corpus-lookup
index (no weights, the same config.json header: algo, target fingerprint), so `shipped_drafts` ranks it with the
neural drafts by eval.json.
"""

from __future__ import annotations

import json
from pathlib import Path

from deepspec.models.drafts.checkpoint import (
    DraftCheckpointError,
    DraftTargetMismatchError,
    build_draft,
    check_target,
    convert_draft_storage,
    load_draft,
    read_checkpoint_header,
    read_draft_config,
    read_draft_weights,
    save_draft,
)
from deepspec.models.drafts.config import DraftConfig
from deepspec.models.drafts.storage import STORAGE_DTYPES

__all__ = [
    "STORAGE_DTYPES",
    "DraftCheckpointError",
    "DraftConfig",
    "DraftTargetMismatchError",
    "best_shipped_draft",
    "build_draft",
    "check_target",
    "convert_draft_storage",
    "load_draft",
    "read_checkpoint_header",
    "measured_acceptance_length",
    "read_draft_config",
    "read_draft_weights",
    "save_draft",
    "shipped_drafts",
]


def shipped_drafts_dir() -> Path:
    from deepspec.paths import drafts_dir

    return drafts_dir()


def shipped_drafts(target, root: Path | None = None) -> list[tuple[Path, float]]:
    """(directory, score) of every draft under drafts/ that fits this target; score = mean greedy τ in eval.json
    (0 when not evaluated). Drafts for other targets are skipped silently."""
    found = []
    root = root or shipped_drafts_dir()
    if not root.is_dir():
        return found
    have = target.fingerprint()
    for config in sorted(root.glob("*/config.json")):
        try:
            header = read_checkpoint_header(config.parent)
        except DraftCheckpointError:
            continue
        if header.get("target") != have:
            continue
        found.append((config.parent, _score(config.parent / "eval.json")))
    return found


def _greedy_results(eval_file: Path) -> list[dict]:
    try:
        report = json.loads(eval_file.read_text())
        return [d for d in report["results"] if d.get("temperature", 0) == 0]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _score(eval_file: Path) -> float:
    taus = [d["acceptance_length"] for d in _greedy_results(eval_file) if "acceptance_length" in d]
    return sum(taus) / len(taus) if taus else 0.0


def measured_acceptance_length(draft_dir: Path) -> float:
    """The draft's mean greedy acceptance length over the sets its eval.json measured; 0 when not evaluated."""
    return _score(Path(draft_dir) / "eval.json")


#: eval.json datasets of general chat nobody trained on: the hand-written chat set and the synthetic held-out split
#: (`python -m training eval --datasets chat,training/data/synth/prompts.heldout.jsonl.gz`)
CHAT_SETS = ("chat", "prompts.heldout")


def chat_speedup(eval_file: Path) -> float | None:
    """The draft's mean greedy speedup over target-only on the chat sets its eval.json measured (CHAT_SETS), or
    None where it measured none: what `auto` ranks by first, since most traffic a server sees is chat, not the
    domains the shipped sets (and the drafts' data) come from."""
    chat = [d for d in _greedy_results(eval_file) if d.get("dataset") in CHAT_SETS]
    speedups = [d["speedup"] for d in chat if d.get("speedup") is not None]
    return sum(speedups) / len(speedups) if speedups else None


def _slows_down(eval_file: Path) -> bool:
    """True when eval.json measured the draft slower than target-only (mean greedy speedup < 1)."""
    speedups = [d["speedup"] for d in _greedy_results(eval_file) if d.get("speedup") is not None]
    return bool(speedups) and sum(speedups) / len(speedups) < 1.0


def ranked_shipped_drafts(target, root: Path | None = None, min_acceptance_length: float = 0.0) -> list[Path]:
    """The shipped drafts `best_shipped_draft` chooses among, best first: those reaching `min_acceptance_length`
    and not measured slower than target-only decoding; those measured on chat (`chat_speedup`) first, fastest
    there first, then the rest by measured greedy acceptance length (an export walks this list for the best one its
    engine can load)."""
    found = [
        (path, score, chat_speedup(path / "eval.json"))
        for path, score in shipped_drafts(target, root)
        if score >= min_acceptance_length and not _slows_down(path / "eval.json")
    ]
    ranked = sorted(found, key=lambda item: (item[2] is None, -(item[2] or 0.0), -item[1]))
    return [path for path, _, _ in ranked]


def best_shipped_draft(target, root: Path | None = None, min_acceptance_length: float = 0.0) -> Path | None:
    """The shipped draft for this target with the highest measured greedy acceptance length, among those reaching
    `min_acceptance_length` and not measured slower than target-only decoding; None when there is none (the
    engine then uses prompt lookup)."""
    ranked = ranked_shipped_drafts(target, root, min_acceptance_length)
    return ranked[0] if ranked else None
