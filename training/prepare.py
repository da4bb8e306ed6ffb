"""Data regeneration: prompts → conversations whose assistant turns are written by the target itself.

A draft must learn the *target's* distribution, not the dataset author's, so every assistant turn is
regenerated (chat template, non-thinking, greedy by default). Two backends, same output:

- our own engine (`SpecEngine`, continuous batching, target-only) — the default, no server needed;
- any OpenAI-compatible `/v1/chat/completions` endpoint (llama.cpp server, vLLM, SGLang, a DeepSpec gateway).

Output rows: `{"id": "<file>:<line>", "source": ..., "conversations": [{"role", "content"}, ...]}`.
Resumable: rows whose id is already in the output are skipped; failures go to `<output>.failures.jsonl`
and are retried on the next run.
"""

from __future__ import annotations

import itertools
import json
import random
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from training.data import jsonl_stem, open_jsonl, read_jsonl_lines


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


def read_prompts(paths: Iterable[Path], limit_per_file: int | None, seed: int, stats: PrepareStats) -> list[PromptRow]:
    """`{"turns": [...]}` lines of each file; malformed lines are counted and skipped; `limit_per_file` rows
    are drawn at random (fixed `seed`) so a small run still covers each source evenly."""
    per_file: list[list[PromptRow]] = []
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"prompt file not found: {path}")
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
            stem = jsonl_stem(path)
            found.append(PromptRow(f"{stem}:{line_no}", str(obj.get("source", stem)), turns))
        if limit_per_file is not None and len(found) > limit_per_file:
            found = random.Random(seed).sample(found, limit_per_file)
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


# ---- backends: list of message lists → list of (answer text, num generated tokens) ----------------------------
Generate = Callable[[list[list[dict]]], list[tuple[str, int]]]


def endpoint_backend(url: str, model: str, max_tokens: int, temperature: float, concurrency: int,
                     timeout_seconds: float = 600.0) -> Generate:
    base = url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"

    def one(messages: list[dict]) -> tuple[str, int]:
        body = json.dumps({"model": model, "messages": messages, "max_tokens": max_tokens,
                           "temperature": temperature, "stream": False}).encode()
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
            except Exception as exc:  # noqa: BLE001 — every failure is logged per row, never fatal
                out.append(exc)
        return out

    return generate


def engine_backend(target, max_tokens: int, temperature: float, batch_size: int, seed: int,
                   max_seq_len: int = 2048) -> Generate:
    """Our engine with continuous batching. The KV cache holds batch_size × max_seq_len positions: the target's
    whole window (8k for SmolLM2) at 24 slots would pin ~5 GB for answers of a few hundred tokens. A longer
    conversation fails with the engine's message and is logged to the failures file."""
    from deepspec.decoding.engine import SpecEngine
    from deepspec.decoding.params import SamplingParams

    engine = SpecEngine(target, None, max_batch_size=batch_size, max_seq_len=max_seq_len)  # clamped to the target's
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed)

    def generate(batch: list[list[dict]]) -> list[tuple[str, int] | Exception]:
        prompts, out, index = [], [None] * len(batch), []
        for i, messages in enumerate(batch):
            try:
                ids = target.encode_chat(messages)
                engine.validate(ids, params)
                prompts.append(ids)
                index.append(i)
            except ValueError as exc:
                out[i] = exc
        for i, result in zip(index, engine.generate(prompts, params) if prompts else []):
            out[i] = (result.text, len(result.token_ids))
        return out

    return generate


#: rows handed to the backend per call, per slot; the output file is appended once per call
ROWS_PER_SLOT = 4


def regenerate(rows: list[PromptRow], generate: Generate, output: Path, batch_size: int,
               stats: PrepareStats, on_batch: Callable[[int, int], None] | None = None) -> PrepareStats:
    """Regenerate every turn of every row not yet in `output`; multi-turn rows are replayed turn by turn."""
    output.parent.mkdir(parents=True, exist_ok=True)
    failures = output.with_suffix(output.suffix + ".failures.jsonl")
    done = finished_ids(output)
    todo = [r for r in rows if r.id not in done]
    stats.num_skipped = len(rows) - len(todo)
    with open_jsonl(output, "at") as out_f, failures.open("a") as fail_f:
        # hand the backend several rows per slot: it refills a slot the moment a row finishes (continuous batching,
        # or a thread pool for --endpoint), so short answers never leave slots idle waiting for the longest one
        for batch in _chunks(todo, batch_size * ROWS_PER_SLOT):
            convs = [[] for _ in batch]
            alive = list(range(len(batch)))
            tokens = 0
            for turn in range(max(len(r.turns) for r in batch)):
                active = [i for i in alive if turn < len(batch[i].turns)]
                for i in active:
                    convs[i].append({"role": "user", "content": batch[i].turns[turn]})
                results = generate([convs[i] for i in active]) if active else []
                for i, res in zip(active, results):
                    if isinstance(res, Exception):
                        fail_f.write(json.dumps({"id": batch[i].id, "error": f"{type(res).__name__}: {res}",
                                                 "time": time.time()}) + "\n")
                        stats.num_failed += 1
                        alive.remove(i)
                        continue
                    text, n = res
                    convs[i].append({"role": "assistant", "content": text})
                    tokens += n
            for i in alive:
                out_f.write(json.dumps({"id": batch[i].id, "source": batch[i].source, "conversations": convs[i]},
                                       ensure_ascii=False) + "\n")
            out_f.flush()
            fail_f.flush()
            stats.num_done += len(alive)
            stats.num_tokens += tokens
            if on_batch is not None:
                on_batch(len(batch), tokens)
    return stats


def _chunks(items: list, n: int) -> Iterator[list]:
    for i in range(0, len(items), n):
        yield items[i : i + n]
