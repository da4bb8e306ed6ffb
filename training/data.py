"""Training data: conversations → token ids with an assistant-only loss mask; the reduced draft vocabulary; a
deterministic, resumable (and rank-sharded) order of sequences.

Files are JSON lines, plain or gzip-compressed (`.jsonl.gz`: the shipped regenerated data is, a fifth of the
size). Rows are either regenerated conversations (`{"conversations": [{"role", "content"}, ...]}`, what `prepare`
writes) or pre-tokenized `{"input_ids": [...], "loss_mask": [...]}`. Malformed lines are skipped and counted.
Under `--labels target` (labels from the target's forward, any text will do) two more kinds are text:
`{"text": "..."}` (tokenized as is) and prompt rows `{"turns": ["...", ...]}` (datasets/train: each turn a user
message through the chat template); both train on every token.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TextIO

import torch

from deepspec.models.chat_templates import require_chat_template
from training.heldout import is_heldout_row, refuse_heldout_file


@dataclass
class Sequence:
    input_ids: list[int]
    #: 1 where the token belongs to an assistant turn (the loss is taken there only)
    loss_mask: list[int]


@dataclass
class DataStats:
    num_rows: int = 0
    num_malformed: int = 0
    num_empty: int = 0
    num_tokens: int = 0
    num_loss_tokens: int = 0
    #: synthetic rows of the held-out split (training/heldout.py), dropped: no draft trains on them
    num_heldout: int = 0
    problems: list[str] = field(default_factory=list)


def open_jsonl(path: str | Path, mode: Literal["rt", "wt", "at"] = "rt") -> TextIO:
    """A text handle on a JSON-lines file: gzip for a `.gz` name (appending adds a gzip member, which every
    reader of the format reads as one stream), plain otherwise."""
    path = Path(path)
    if path.suffix == ".gz":
        return gzip.open(path, mode, encoding="utf-8")
    return path.open(mode, encoding="utf-8")


def read_jsonl_lines(path: str | Path) -> list[str]:
    """Every line of a plain or gzip JSON-lines file; a gzip file cut short raises ValueError naming it."""
    try:
        with open_jsonl(path) as f:
            return f.read().splitlines()
    except (EOFError, gzip.BadGzipFile) as exc:
        raise ValueError(
            f"{path}: not a readable gzip file ({exc}): a writer may still be appending to it (python -m training "
            f"synth / prepare; read it when the run is done), a killed one left it cut short (its next run mends "
            f"it: training.data.recover_torn_gzip), or it is damaged (re-compress it with `gzip -k`)"
        ) from None


def recover_torn_gzip(path: str | Path) -> int | None:
    """Mend a `.jsonl.gz` that an appending writer (synth, prepare) left cut short when it was killed: its last gzip
    member has no end, so every reader would refuse the whole file. The file is rewritten with every whole line that
    decompresses (the writers flush every few rows, so that is all but the last seconds of work) and the next run
    appends after them. Returns the lines kept, or None where the file is whole, plain or absent. Readers stay strict
    (`read_jsonl_lines`): only the tool that owns a file mends it, at its own start."""
    path = Path(path)
    if path.suffix != ".gz" or not path.is_file():
        return None
    try:
        read_jsonl_lines(path)
        return None
    except ValueError:
        pass
    text = _decompressed_prefix(path.read_bytes()).decode("utf-8", errors="replace")
    whole = text[: text.rfind("\n") + 1]
    mended = path.with_name(path.name + ".mending")
    with gzip.open(mended, "wt", encoding="utf-8") as f:
        f.write(whole)
    os.replace(mended, path)
    kept = whole.count("\n")
    print(f"{path}: cut short by a killed writer; kept its {kept} whole lines", file=sys.stderr)
    return kept


def _decompressed_prefix(data: bytes) -> bytes:
    """What a run of gzip members decompresses to, up to where the data stops making sense."""
    out = []
    while data:
        member = zlib.decompressobj(wbits=31)
        try:
            out.append(member.decompress(data))
        except zlib.error:
            break
        if not member.eof:
            break
        data = member.unused_data
    return b"".join(out)


def jsonl_stem(path: str | Path) -> str:
    """The file's name without `.jsonl` / `.jsonl.gz` (row ids are `<stem>:<line>`, whichever way it is stored)."""
    name = Path(path).name
    for suffix in (".jsonl.gz", ".jsonl", ".gz"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return Path(name).stem


def render(target, messages: list[dict], add_generation_prompt: bool = False) -> str:
    """The messages through the target's chat template; a target without one (and no --chat-template) is refused
    with the one-line MissingChatTemplateError naming the fix, not transformers' traceback."""
    require_chat_template(target.tokenizer, target.name, target.spec.family)
    return target.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)


def tokenize_conversation(target, messages: list[dict], max_len: int) -> Sequence:
    """Token ids of the chat-templated conversation; loss_mask = 1 on assistant content and its end token.

    Each message is tokenized as the text its template adds to the previous prefix (chat templates such as
    ChatML separate turns with special tokens, so segment-wise tokenization equals whole-text tokenization)."""
    ids: list[int] = []
    mask: list[int] = []
    prev = ""

    def add(text: str, value: int) -> None:
        seg = target.tokenizer(text, add_special_tokens=False)["input_ids"]
        ids.extend(seg)
        mask.extend([value] * len(seg))

    for i, msg in enumerate(messages):
        if msg["role"] == "assistant":
            prompt = render(target, messages[:i], add_generation_prompt=True)
            if not prompt.startswith(prev):
                raise ValueError("the chat template does not render prefixes consistently")
            add(prompt[len(prev) :], 0)
            prev = prompt
        text = render(target, messages[: i + 1])
        if not text.startswith(prev):
            raise ValueError("the chat template does not render prefixes consistently")
        add(text[len(prev) :], 1 if msg["role"] == "assistant" else 0)
        prev = text
    return Sequence(ids[:max_len], mask[:max_len])


def _valid_messages(obj) -> list[dict] | None:
    conv = obj.get("conversations") if isinstance(obj, dict) else None
    if not isinstance(conv, list) or not conv:
        return None
    for m in conv:
        if not (
            isinstance(m, dict)
            and m.get("role") in ("system", "user", "assistant")
            and isinstance(m.get("content"), str)
        ):
            return None
    return conv if any(m["role"] == "assistant" and m["content"] for m in conv) else None


def text_sequence(target, obj, max_len: int) -> Sequence | None:
    """A `{"text"}` or `{"turns"}` row as a sequence trained on every token; None when it is neither."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("text"), str) and obj["text"]:
        text = obj["text"]
    elif isinstance(obj.get("turns"), list) and obj["turns"] and all(isinstance(t, str) for t in obj["turns"]):
        text = render(target, [{"role": "user", "content": t} for t in obj["turns"]])
    else:
        return None
    ids = target.tokenizer(text, add_special_tokens=False)["input_ids"][:max_len]
    return Sequence(ids, [1] * len(ids))


def load_sequences(
    paths: list[Path], target, max_len: int, stats: DataStats | None = None, text_rows: bool = False
) -> list[Sequence]:
    """Read and tokenize every usable row with the target's tokenizer and chat template; raises ValueError when
    nothing usable is left. `text_rows` also takes `{"text"}` and `{"turns"}` rows (for `--labels target`: the
    target labels them itself)."""
    stats = stats if stats is not None else DataStats()
    out: list[Sequence] = []
    if not paths:
        raise ValueError("no training data: pass --data <file.jsonl> (written by `python -m training prepare`)")
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"training data not found: {path}")
        refuse_heldout_file(path)
        for line_no, line in enumerate(read_jsonl_lines(path), 1):
            if not line.strip():
                continue
            stats.num_rows += 1
            try:
                obj = json.loads(line)
            except ValueError:
                stats.num_malformed += 1
                stats.problems.append(f"{path}:{line_no}: not JSON")
                continue
            if is_heldout_row(obj):
                stats.num_heldout += 1
                continue
            if isinstance(obj, dict) and "input_ids" in obj:
                ids, mask = obj.get("input_ids"), obj.get("loss_mask")
                if not (
                    isinstance(ids, list)
                    and isinstance(mask, list)
                    and len(ids) == len(mask)
                    and all(isinstance(t, int) for t in ids)
                ):
                    stats.num_malformed += 1
                    stats.problems.append(f"{path}:{line_no}: input_ids/loss_mask missing or of different lengths")
                    continue
                seq = Sequence(ids[:max_len], [int(bool(m)) for m in mask[:max_len]])
            elif isinstance(obj, dict) and ("text" in obj or "turns" in obj) and "conversations" not in obj:
                seq = text_sequence(target, obj, max_len) if text_rows else None
                if seq is None:
                    stats.num_malformed += 1
                    stats.problems.append(
                        f"{path}:{line_no}: "
                        + (
                            "'text' must be a non-empty string, 'turns' a list of strings"
                            if text_rows
                            else "a text row has no target-written answer to learn: train it with --labels target"
                        )
                    )
                    continue
            else:
                messages = _valid_messages(obj)
                if messages is None:
                    stats.num_malformed += 1
                    stats.problems.append(f"{path}:{line_no}: need 'conversations' with an assistant turn")
                    continue
                seq = tokenize_conversation(target, messages, max_len)
            if sum(seq.loss_mask[1:]) == 0:
                stats.num_empty += 1
                continue
            stats.num_tokens += len(seq.input_ids)
            stats.num_loss_tokens += sum(seq.loss_mask)
            out.append(seq)
    if not out:
        first = f"; first: {stats.problems[0]}" if stats.problems else ""
        raise ValueError(
            f"no usable training rows in {', '.join(map(str, paths))} ({stats.num_malformed} malformed,"
            f" {stats.num_empty} without assistant tokens{first})"
        )
    return out


def build_draft_vocab(
    sequences: list[Sequence], size: int, vocab_size: int, always: tuple[int, ...] = ()
) -> torch.Tensor:
    """The `size` most frequent assistant tokens (plus `always`, e.g. EOS), as sorted target ids [size]."""
    counts = Counter()
    for seq in sequences:
        counts.update(t for t, m in zip(seq.input_ids, seq.loss_mask) if m)
    chosen = [t for t in always if 0 <= t < vocab_size]
    for token, _ in counts.most_common():
        if len(chosen) >= size:
            break
        if token not in chosen:
            chosen.append(token)
    filler = (t for t in range(vocab_size) if t not in set(chosen))  # rare: fewer distinct tokens than size
    while len(chosen) < size:
        chosen.append(next(filler))
    return torch.tensor(sorted(chosen[:size]), dtype=torch.long)


class SequenceOrder:
    """Epoch-wise shuffled order of sequence indices, sharded over ranks; `state()`/`load_state()` make a resumed
    run see exactly the batches the uninterrupted one would have."""

    def __init__(self, num: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1):
        self.num, self.batch_size, self.seed = num, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.epoch, self.position = 0, 0

    def _indices(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1000003 + self.epoch)
        perm = torch.randperm(self.num, generator=g).tolist()
        usable = len(perm) - len(perm) % self.world_size if len(perm) >= self.world_size else len(perm)
        return perm[:usable][self.rank :: self.world_size] or perm

    def next_batch(self) -> list[int]:
        idx = self._indices()
        if self.position >= len(idx):
            self.epoch, self.position = self.epoch + 1, 0
            idx = self._indices()
        batch = idx[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return batch

    def state(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def collate(sequences: list[Sequence], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad → tokens [B, T], loss_mask [B, T] (padding has mask 0; causal attention never looks right)."""
    T = max(len(s.input_ids) for s in sequences)
    tokens = torch.full((len(sequences), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(sequences), T, dtype=torch.long)
    for i, s in enumerate(sequences):
        tokens[i, : len(s.input_ids)] = torch.tensor(s.input_ids)
        mask[i, : len(s.loss_mask)] = torch.tensor(s.loss_mask)
    return tokens, mask
