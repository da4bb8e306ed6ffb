"""Magpie-style user turns written by the target itself: broad training prompts with no dataset.

An instruction-tuned target has learned what users ask. Fed its own chat template up to the start of a user turn
(the "user prefix": `<|im_start|>user\\n` after the system turn) it writes a user request, and ends it with its
end-of-turn token (Magpie, Xu et al. 2024, arXiv:2406.08464). Sampled at temperature ~1 with top-p 0.95, batched on
the engine (the native CPU decoder by default), each turn is filtered (synth_filters.reject_reason), deduplicated
exactly and by MinHash near-duplicate search, bucketed by topic, and written to one of three files:

- `<out>`: the training prompts, `{"id", "source": "synth/<seed>", "topic", "turns": [text], "tokens",
  "attempt"}` — the prompt-row format `prepare` reads, so their answers are regenerated like any other prompts;
- `<out minus .jsonl>.heldout.jsonl`: the held-out split (training/heldout.py), never trained on;
- `<out minus .jsonl>.rejected.jsonl`: every rejected turn with its reason (the run's report reads them).

Seeding: the template's own system prompt ("default") or "You are a helpful assistant for <topic>." over TOPICS
widens what the target asks about (`--seeding`); the report compares the two by acceptance, duplicates, distinct-2
and topic spread. Resumable: the files are the state — a resumed run re-indexes what they hold for deduplication
and draws the attempts (each its own sampling seed) they do not hold yet.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from training.data import open_jsonl, read_jsonl_lines
from training.heldout import heldout_path, is_heldout, text_key
from training.synth_filters import Deduplicator, distinct_n, reject_reason, topic_of

#: the system-prompt topics of `--seeding topics` (one system prompt each, taken in turn)
TOPICS = (
    "Python programming",
    "JavaScript and web development",
    "SQL and databases",
    "algorithms and data structures",
    "shell scripting and Linux",
    "mathematics",
    "math word problems",
    "creative writing",
    "emails and business writing",
    "editing and summarizing text",
    "science",
    "history and geography",
    "health and fitness",
    "cooking and recipes",
    "travel planning",
    "personal finance",
    "business and marketing",
    "JSON and structured data",
    "everyday advice",
    "casual conversation",
    "language learning and translation",
    "philosophy and ethics",
)
DEFAULT_SEED = "default"
SEEDINGS = ("mixed", "default", "topics")
_MARKER = "\u241eDEEPSPEC_USER_TURN\u241e"


def seed_names(seeding: str) -> list[str]:
    """The system-prompt seeds one pass of `seeding` takes in turn: mixed = every topic and the default alternately."""
    if seeding not in SEEDINGS:
        raise ValueError(f"seeding must be one of {', '.join(SEEDINGS)}, got {seeding!r}")
    if seeding == DEFAULT_SEED:
        return [DEFAULT_SEED]
    if seeding == "topics":
        return list(TOPICS)
    return [name for topic in TOPICS for name in (DEFAULT_SEED, topic)]


def system_prompt(seed: str) -> str | None:
    return None if seed == DEFAULT_SEED else f"You are a helpful assistant for {seed}."


def user_prefix_ids(target, system: str | None) -> list[int]:
    """Token ids of the chat template rendered up to where a user's words start (the template's own default system
    turn included when `system` is None)."""
    from training.data import render

    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": _MARKER}]
    text = render(target, messages)
    if _MARKER not in text:
        raise ValueError(f"{target.name}'s chat template does not render the user's text verbatim; no user prefix")
    return target.tokenizer(text[: text.index(_MARKER)], add_special_tokens=False)["input_ids"]


@dataclass
class SynthSettings:
    num_prompts: int
    seeding: str = "mixed"
    max_tokens: int = 192
    temperature: float = 1.0
    top_p: float = 0.95
    seed: int = 0
    batch_size: int = 8
    min_words: int = 3
    max_chars: int = 2000
    near_duplicate_threshold: float = 0.7
    #: attempts per wanted prompt before giving up (a target that writes nothing usable must not loop forever)
    max_attempts_per_prompt: int = 20


@dataclass
class SynthFiles:
    prompts: Path

    @property
    def heldout(self) -> Path:
        return heldout_path(self.prompts)

    @property
    def rejected(self) -> Path:
        return self.prompts.with_name(heldout_path(self.prompts).name.replace(".heldout.", ".rejected."))

    def existing(self) -> list[Path]:
        return [p for p in (self.prompts, self.heldout, self.rejected) if p.is_file() and p.stat().st_size]


@dataclass
class SynthProgress:
    accepted: int = 0
    heldout: int = 0
    attempts: int = 0
    tokens: int = 0
    #: the attempt indices (sampling seeds) the files already hold; rows from before they were recorded count here
    done_attempts: set = field(default_factory=set)
    unindexed_attempts: int = 0
    rejected: Counter = field(default_factory=Counter)


def read_rows(path: Path) -> list[dict]:
    """The JSON rows of a file (none if it does not exist yet), skipping a line torn by a killed writer."""
    if not path.is_file():
        return []
    out = []
    for line in read_jsonl_lines(path):
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a torn last line from a killed run
    return out


def resume_state(files: SynthFiles, dedup: Deduplicator) -> SynthProgress:
    """What the files already hold: their turns enter the dedup index, and the attempt count continues."""
    state = SynthProgress()
    for path, kind in ((files.prompts, "accepted"), (files.heldout, "heldout"), (files.rejected, "rejected")):
        for row in read_rows(path):
            state.attempts += 1
            if isinstance(row.get("attempt"), int):
                state.done_attempts.add(row["attempt"])
            else:
                state.unindexed_attempts += 1
            if kind == "rejected":
                state.rejected[row.get("reason", "?")] += 1
                continue
            text = (row.get("turns") or [""])[0]
            dedup.check_and_add(text)
            setattr(state, kind, getattr(state, kind) + 1)
    return state


class _SynthWriter:
    """Appends each outcome to its file; flushes every `flush_every` rows so a killed run loses little."""

    def __init__(self, files: SynthFiles, flush_every: int = 16):
        files.prompts.parent.mkdir(parents=True, exist_ok=True)
        self._handles = {
            "accepted": open_jsonl(files.prompts, "at"),
            "heldout": open_jsonl(files.heldout, "at"),
            "rejected": open_jsonl(files.rejected, "at"),
        }
        self._pending, self.flush_every = 0, flush_every

    def write(self, kind: str, row: dict) -> None:
        self._handles[kind].write(json.dumps(row, ensure_ascii=False) + "\n")
        self._pending += 1
        if self._pending >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        for handle in self._handles.values():
            handle.flush()
        self._pending = 0

    def close(self) -> None:
        for handle in self._handles.values():
            handle.close()


def synthesize(
    target, files: SynthFiles, settings: SynthSettings, *, on_result: Callable[[SynthProgress, int], None] | None = None
) -> SynthProgress:
    """Sample user turns until the files hold `settings.num_prompts` accepted ones (training + held out)."""
    from deepspec.decoding.engine import SpecEngine
    from deepspec.decoding.params import SamplingParams
    from training.streaming import EngineStream

    seeds = seed_names(settings.seeding)
    prefixes = {s: user_prefix_ids(target, system_prompt(s)) for s in seeds}
    special_ids = frozenset(getattr(target.tokenizer, "all_special_ids", ()))
    stop_ids = tuple(sorted(special_ids))  # the end-of-turn token, and any other template token, ends a turn
    dedup = Deduplicator(settings.near_duplicate_threshold)
    state = resume_state(files, dedup)
    max_attempts = settings.num_prompts * settings.max_attempts_per_prompt
    longest = max(len(p) for p in prefixes.values())
    engine = SpecEngine(target, None, max_batch_size=settings.batch_size, max_seq_len=longest + settings.max_tokens + 1)
    stream = EngineStream(engine, settings.batch_size)

    # attempts finish out of order: a killed run leaves gaps, which a resumed one fills before going on, so it draws
    # exactly the turns an uninterrupted run would (rows from before attempts were recorded are taken as a prefix)
    attempt_indices = itertools.filterfalse(state.done_attempts.__contains__, itertools.count(state.unindexed_attempts))

    def refill() -> bool:
        wanted = settings.num_prompts - state.accepted - state.heldout
        if wanted <= stream.num_in_flight or state.attempts + stream.num_in_flight >= max_attempts:
            return False
        k = next(attempt_indices)  # every attempt has its own seed
        seed = seeds[k % len(seeds)]
        params = SamplingParams(
            max_tokens=settings.max_tokens,
            temperature=settings.temperature,
            top_p=settings.top_p,
            seed=settings.seed * 1_000_003 + k,
            stop_token_ids=stop_ids,
        )
        stream.submit((seed, k), prefixes[seed], params)
        return True

    writer = _SynthWriter(files)
    try:
        for result in stream.run(refill):
            state.attempts += 1
            state.tokens += len(result.token_ids)
            kind, row = _judge(result, special_ids, dedup, settings)
            if kind == "rejected":
                state.rejected[row["reason"]] += 1
            else:
                setattr(state, kind, getattr(state, kind) + 1)
            writer.write(kind, row)
            if on_result is not None:
                on_result(state, len(result.token_ids))
    finally:
        writer.close()
    return state


def _judge(result, special_ids: frozenset[int], dedup: Deduplicator, settings: SynthSettings) -> tuple[str, dict]:
    """(file kind, row) of one sampled turn: rejected with its reason, held out, or accepted."""
    text = result.text.strip()
    seed, attempt = result.key
    source = f"synth/{seed}"
    reason = (
        f"engine: {result.error}"
        if result.error is not None
        else reject_reason(
            result.text,
            result.token_ids,
            result.finish_reason,
            special_ids,
            min_words=settings.min_words,
            max_chars=settings.max_chars,
        )
    )
    if reason is None:
        reason = dedup.check_and_add(text)
    if reason is not None:
        return "rejected", {
            "source": source,
            "reason": reason,
            "text": result.text,
            "tokens": len(result.token_ids),
            "attempt": attempt,
        }
    row = {
        "id": f"synth-{text_key(text)}",
        "source": source,
        "topic": topic_of(text),
        "turns": [text],
        "tokens": len(result.token_ids),
        "attempt": attempt,
    }
    return ("heldout" if is_heldout(text) else "accepted"), row


def synth_report(files: SynthFiles) -> dict:
    """Counts, rejection reasons, topic and length spread, and the default-vs-topic seeding comparison, read from
    the files (so a resumed or finished run reports the same way). distinct-2 falls as a sample grows, so each
    seeding mode's is taken on the same number of its first kept turns."""
    kept = read_rows(files.prompts) + read_rows(files.heldout)
    rejected = read_rows(files.rejected)
    by_mode: dict[str, dict] = defaultdict(lambda: {"attempts": 0, "kept": [], "rejected": Counter()})
    for row in kept:
        mode = by_mode[_mode(row)]
        mode["attempts"] += 1
        mode["kept"].append(row)
    for row in rejected:
        mode = by_mode[_mode(row)]
        mode["attempts"] += 1
        mode["rejected"][row.get("reason", "?")] += 1
    tokens = sorted(int(r.get("tokens", 0)) for r in kept)
    return {
        "kept": len(kept),
        "heldout": len(read_rows(files.heldout)),
        "rejected": len(rejected),
        "rejected_by_reason": dict(Counter(r.get("reason", "?") for r in rejected).most_common()),
        "topics": dict(Counter(r.get("topic", "?") for r in kept).most_common()),
        "user_turn_tokens": {q: _percentile(tokens, q) for q in (10, 50, 90, 99)},
        "seeding": {
            name: _mode_summary(m, min(len(m["kept"]) for m in by_mode.values())) for name, m in sorted(by_mode.items())
        },
    }


def _mode(row: dict) -> str:
    return "default" if row.get("source") == f"synth/{DEFAULT_SEED}" else "topic-seeded"


def _mode_summary(mode: dict, diversity_sample: int) -> dict:
    kept, rejected = mode["kept"], mode["rejected"]
    dups = rejected["exact_duplicate"] + rejected["near_duplicate"]
    topics = Counter(r.get("topic", "?") for r in kept)
    total = sum(topics.values())
    entropy = max(0.0, -sum(c / total * math.log2(c / total) for c in topics.values())) if total else 0.0
    attempts = max(mode["attempts"], 1)
    return {
        "attempts": mode["attempts"],
        "kept_rate": round(len(kept) / attempts, 3),
        "duplicate_rate": round(dups / attempts, 3),
        "dirty_rate": round((sum(rejected.values()) - dups) / attempts, 3),
        "distinct_2": round(distinct_n([r["turns"][0] for r in kept[:diversity_sample]]), 3),
        "distinct_2_sample": diversity_sample,
        "topic_entropy_bits": round(entropy, 2),
    }


def _percentile(values: list[int], q: float) -> int:
    return values[min(len(values) - 1, int(len(values) * q / 100))] if values else 0
