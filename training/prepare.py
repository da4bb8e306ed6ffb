"""Data regeneration: prompts → conversations whose assistant turns are written by the target itself.

A draft must learn the *target's* distribution, not the dataset author's, so every assistant turn is
regenerated (chat template, non-thinking, greedy by default). Two ways, same output:

- our own engine (`SpecEngine`, target-only) on the native CPU decoder (the fastest CPU backend; `--backend auto`
  picks it where it builds) or the PyTorch target, with continuous batching across rows (`stream_regenerate`);
- any OpenAI-compatible `/v1/chat/completions` endpoint (llama.cpp server, vLLM, SGLang, a DeepSpec gateway).

Output rows: `{"id": "<file>:<line>", "source": ..., "conversations": [{"role", "content"}, ...],
"answer_tokens": n}`. Resumable: rows whose id is already in the output are skipped; rows are appended as they
finish and flushed every few seconds; failures go to `<output>.failures.jsonl` and are retried on the next run.
Synthetic prompts of the held-out split (training/heldout.py) are never answered here.
"""

from __future__ import annotations

import itertools
import json
import random
import time
import urllib.request
from collections.abc import Callable, Hashable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from deepspec.models.backends import NATIVE, ONNX, PYTORCH, backend_choices
from training.data import jsonl_stem, open_jsonl, read_jsonl_lines
from training.heldout import is_heldout_row, refuse_heldout_file


@dataclass
class PromptRow:
    id: str
    source: str
    turns: list[str]


@dataclass
class PrepareStats:
    num_done: int = 0
    num_skipped: int = 0
    num_failed: int = 0
    num_malformed: int = 0
    num_tokens: int = 0
    #: synthetic prompts of the held-out split (training/heldout.py), left out
    num_heldout: int = 0


def read_prompts(
    paths: Iterable[Path], limit_per_file: int | None | list[int | None], seed: int, stats: PrepareStats
) -> list[PromptRow]:
    """`{"turns": [...]}` lines of each file; malformed lines are counted and skipped; `limit_per_file` rows
    are drawn at random (fixed `seed`) so a small run still covers each source evenly (one limit for every file, or
    a list with each file's own, None = all of it)."""
    paths = list(paths)
    limits = limit_per_file if isinstance(limit_per_file, list) else [limit_per_file] * len(paths)
    per_file: list[list[PromptRow]] = []
    for path, limit in zip(paths, limits):
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"prompt file not found: {path}")
        refuse_heldout_file(path)
        found = []
        for line_no, line in enumerate(read_jsonl_lines(path), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                turns = obj["turns"]
                if not (isinstance(turns, list) and turns and all(isinstance(t, str) and t for t in turns)):
                    raise ValueError
            except (ValueError, KeyError, TypeError):
                stats.num_malformed += 1
                continue
            if is_heldout_row(obj):  # never answered for training, whichever file it came in
                stats.num_heldout += 1
                continue
            stem = jsonl_stem(path)
            found.append(PromptRow(f"{stem}:{line_no}", str(obj.get("source", stem)), turns))
        if limit is not None and len(found) > limit:
            found = random.Random(seed).sample(found, limit)
        per_file.append(found)
    # round-robin across files, so an interrupted run still holds every source in proportion
    return [row for group in itertools.zip_longest(*per_file) for row in group if row is not None]


def finished_ids(output: Path) -> set[str]:
    done = set()
    if output.is_file():
        for line in read_jsonl_lines(output):
            try:
                done.add(json.loads(line)["id"])
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line from an interrupted run; the row is simply redone
    return done


# ---- backends: list of message lists → list of (answer text, num generated tokens), or the error of each failed one
Generate = Callable[[list[list[dict]]], list[tuple[str, int] | Exception]]


def endpoint_backend(
    url: str, model: str, max_tokens: int, temperature: float, concurrency: int, timeout_seconds: float = 600.0
) -> Generate:
    base = url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"

    def one(messages: list[dict]) -> tuple[str, int]:
        body = json.dumps(
            {
                "model": model,
                "messages": messages,
                "max_tokens": max_tokens,
                "temperature": temperature,
                "stream": False,
            }
        ).encode()
        req = urllib.request.Request(base + "/chat/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout_seconds) as resp:
            obj = json.loads(resp.read())
        text = obj["choices"][0]["message"]["content"] or ""
        return text, int((obj.get("usage") or {}).get("completion_tokens") or 0)

    pool = ThreadPoolExecutor(max_workers=concurrency)

    def generate(batch: list[list[dict]]) -> list[tuple[str, int] | Exception]:
        futures = [pool.submit(one, m) for m in batch]
        out = []
        for f in futures:
            try:
                out.append(f.result())
            except Exception as exc:
                out.append(exc)
        return out

    return generate


def load_engine_target(
    spec: str,
    backend: str,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    chat_template: str | None = None,
    max_seq_len: int | None = None,
    num_threads: int | None = None,
):
    """(target, backend name): `native` = the native CPU decoder (deepspec/models/native: the GGUF's own 4-bit
    blocks for the default target, ~7x the PyTorch engine's tokens/s at 8 rows), `pytorch` = the PyTorch target in
    `dtype`, `auto` = native where it builds (a CPU and a C compiler), PyTorch otherwise. `num_threads`: the
    native decoder's threads (default torch's count); one thread wastes no time waiting for a sibling that the
    scheduler has parked, which is what a low-priority run on a busy machine wants."""
    from deepspec.models import load_target

    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend != PYTORCH and device == "cpu":
        from deepspec.models.native import NativeUnavailable, load_native_target

        try:
            target = load_native_target(
                spec, max_seq_len=max_seq_len, chat_template=chat_template, for_chat=True, num_threads=num_threads
            )
            return target, f"native {target.quantization} ({target.isa}, {target.num_threads} threads)"
        except NativeUnavailable:
            if backend == NATIVE:
                raise
    elif backend == NATIVE:
        raise ValueError(f"the native decoder runs on the CPU only, not on {device}")
    target = load_target(spec, dtype=dtype, device=device, chat_template=chat_template, for_chat=True)
    return target, f"pytorch {dtype} on {device}"


#: the backends regeneration runs on (deepspec/models/backends.py; auto = native where it builds, else pytorch)
BACKENDS = backend_choices(without=(ONNX,))


class _RowWriter:
    """The output and failures files of a regeneration run: rows appended as they finish, flushed every few seconds
    (a killed run loses at most those), failures logged per row with the error and retried by the next run."""

    def __init__(self, output: Path, stats: PrepareStats, flush_every_seconds: float = 5.0):
        output.parent.mkdir(parents=True, exist_ok=True)
        self.stats, self.flush_every_seconds = stats, flush_every_seconds
        self._out = open_jsonl(output, "at")
        self._fail = output.with_suffix(output.suffix + ".failures.jsonl").open("a")
        self._last_flush = time.monotonic()

    def write(self, row: PromptRow, conversation: list[dict], answer_tokens: int) -> None:
        self._out.write(
            json.dumps(
                {"id": row.id, "source": row.source, "conversations": conversation, "answer_tokens": answer_tokens},
                ensure_ascii=False,
            )
            + "\n"
        )
        self.stats.num_done += 1
        self.stats.num_tokens += answer_tokens
        self._maybe_flush()

    def fail(self, row_id: str, exc: Exception) -> None:
        self._fail.write(
            json.dumps({"id": row_id, "error": f"{type(exc).__name__}: {exc}", "time": time.time()}) + "\n"
        )
        self.stats.num_failed += 1
        self._maybe_flush()

    def _maybe_flush(self, force: bool = False) -> None:
        if force or time.monotonic() - self._last_flush >= self.flush_every_seconds:
            self._out.flush()
            self._fail.flush()
            self._last_flush = time.monotonic()

    def __enter__(self) -> _RowWriter:
        return self

    def __exit__(self, *exc) -> None:
        self._maybe_flush(force=True)
        self._out.close()
        self._fail.close()


def _todo(rows: list[PromptRow], output: Path, stats: PrepareStats) -> list[PromptRow]:
    done = finished_ids(output)
    todo = [r for r in rows if r.id not in done]
    stats.num_skipped = len(rows) - len(todo)
    return todo


def stream_regenerate(
    rows: list[PromptRow],
    target,
    params,
    output: Path,
    stats: PrepareStats,
    *,
    batch_size: int = 8,
    max_seq_len: int = 2048,
    on_row: Callable[[int], None] | None = None,
) -> PrepareStats:
    """Regenerate every row not yet in `output` on our engine (`target`: native or PyTorch) with continuous batching
    across rows: a slot freed by a short answer takes the next turn at once, and each row is written when its last
    turn lands. Multi-turn rows replay turn by turn; a turn the engine refuses (longer than `max_seq_len`) logs the
    row as failed. `on_row(answer_tokens)` after each finished row (progress)."""
    from deepspec.decoding.engine import SpecEngine
    from training.streaming import EngineStream

    todo = iter(_todo(rows, output, stats))
    engine = SpecEngine(target, None, max_batch_size=batch_size, max_seq_len=max_seq_len)  # clamped to the target's
    stream = EngineStream(engine, batch_size)
    open_rows: dict[Hashable, tuple[PromptRow, list[dict], list[int]]] = {}  # id -> (row, conversation, tokens)

    def submit_turn(row: PromptRow, conversation: list[dict]) -> None:
        conversation.append({"role": "user", "content": row.turns[len(conversation) // 2]})
        stream.submit(row.id, target.encode_chat(conversation), params)

    def refill() -> bool:
        row = next(todo, None)
        if row is None:
            return False
        open_rows[row.id] = (row, [], [0])
        submit_turn(row, open_rows[row.id][1])
        return True

    with _RowWriter(output, stats) as writer:
        for result in stream.run(refill):
            row, conversation, tokens = open_rows[result.key]
            if result.error is not None:
                writer.fail(row.id, result.error)
                del open_rows[row.id]
                continue
            conversation.append({"role": "assistant", "content": result.text})
            tokens[0] += len(result.token_ids)
            if len(conversation) // 2 < len(row.turns):
                submit_turn(row, conversation)
                continue
            writer.write(row, conversation, tokens[0])
            del open_rows[row.id]
            if on_row is not None:
                on_row(tokens[0])
    return stats


#: rows handed to an endpoint backend per call, per slot; the output file is appended once per call
ROWS_PER_SLOT = 4


def regenerate(
    rows: list[PromptRow],
    generate: Generate,
    output: Path,
    batch_size: int,
    stats: PrepareStats,
    on_batch: Callable[[int, int], None] | None = None,
) -> PrepareStats:
    """Regenerate every turn of every row not yet in `output` through `generate` (the endpoint backend: a batch of
    message lists per call); multi-turn rows are replayed turn by turn."""
    todo = _todo(rows, output, stats)
    with _RowWriter(output, stats) as writer:
        # hand the backend several rows per slot: its thread pool refills a slot the moment a row finishes, so short
        # answers never leave slots idle waiting for the longest one
        for batch in _chunks(todo, batch_size * ROWS_PER_SLOT):
            convs = [[] for _ in batch]
            counts = [0] * len(batch)
            alive = list(range(len(batch)))
            for turn in range(max(len(r.turns) for r in batch)):
                active = [i for i in alive if turn < len(batch[i].turns)]
                for i in active:
                    convs[i].append({"role": "user", "content": batch[i].turns[turn]})
                results = generate([convs[i] for i in active]) if active else []
                for i, res in zip(active, results):
                    if isinstance(res, Exception):
                        writer.fail(batch[i].id, res)
                        alive.remove(i)
                        continue
                    text, n = res
                    convs[i].append({"role": "assistant", "content": text})
                    counts[i] += n
            for i in alive:
                writer.write(batch[i], convs[i], counts[i])
            if on_batch is not None:
                on_batch(len(batch), sum(counts[i] for i in alive))
    return stats


def _chunks(items: list, n: int) -> Iterator[list]:
    for i in range(0, len(items), n):
        yield items[i : i + n]
