"""The held-out split of the synthetic chat: which prompts no draft may ever train on.

A prompt is held out by a hash of its own text, not by a row id or a file position, so the decision is the same in
every file the prompt travels through (the synthesized prompts, a regenerated conversation that starts with it, a
copy someone made by hand) and in every session: `synth` writes held-out prompts to `<out>.heldout.jsonl` and
never into the training prompts, and the training loaders (`data.load_sequences`, so `train`, `corpus`,
`relayout`) and `prepare` drop a synthetic row whose first user turn hashes into the split and refuse a file named
`*.heldout.jsonl[.gz]`. Only rows marked synthetic (`source` starting with `synth`) are tested, so the shipped
gsm8k / Code Alpaca rows train exactly as before.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

#: the fraction of synthetic prompts held out, in parts per 10,000 (2%)
HELDOUT_PER_10K = 200
#: the `source` prefix that marks a synthesized row (synth.py writes `synth/<seed>`)
SYNTH_SOURCE_PREFIX = "synth"
HELDOUT_SUFFIXES = (".heldout.jsonl", ".heldout.jsonl.gz")

_SPACE = re.compile(r"\s+")


def normalize(text: str) -> str:
    """The text the split (and exact dedup) keys on: case and runs of whitespace do not make a new prompt."""
    return _SPACE.sub(" ", text).strip().lower()


def text_key(text: str) -> str:
    """A stable 16-hex-digit key of the normalized text (also the synthetic row's id)."""
    return hashlib.blake2b(normalize(text).encode("utf-8"), digest_size=8).hexdigest()


def is_heldout(text: str, per_10k: int = HELDOUT_PER_10K) -> bool:
    return int(text_key(text), 16) % 10_000 < per_10k


def heldout_path(out: Path) -> Path:
    """`x.jsonl` -> `x.heldout.jsonl` (and `.jsonl.gz` alike): the held-out prompts sit beside the training ones."""
    name = out.name
    for suffix in (".jsonl.gz", ".jsonl"):
        if name.endswith(suffix):
            return out.with_name(name[: -len(suffix)] + ".heldout" + suffix)
    return out.with_name(name + ".heldout.jsonl")


def refuse_heldout_file(path: Path) -> None:
    """Raise ValueError for a held-out file handed to a training step."""
    if Path(path).name.endswith(HELDOUT_SUFFIXES):
        raise ValueError(
            f"{path} is a held-out evaluation split: no draft may train on it (evaluate with it "
            f"instead, e.g. `python -m training eval`)"
        )


def is_heldout_row(obj: dict) -> bool:
    """A synthetic row (prompt row or conversation) whose first user turn falls in the held-out split."""
    if not isinstance(obj, dict) or not str(obj.get("source", "")).startswith(SYNTH_SOURCE_PREFIX):
        return False
    turns = obj.get("turns")
    if isinstance(turns, list) and turns and isinstance(turns[0], str):
        return is_heldout(turns[0])
    for message in obj.get("conversations") or ():
        if isinstance(message, dict) and message.get("role") == "user" and isinstance(message.get("content"), str):
            return is_heldout(message["content"])
    return False
