"""Routing by expected goodput: which worker gives a request the most tokens per second, and which one holds its
session's history.

The Gateway API Inference Extension's endpoint picker (and llm-d's scheduler on top of it) scores each pod with a
weighted sum of normalised signals scraped from its metrics: queue depth, KV-cache utilisation, a prefix-cache
match (gateway-api-inference-extension pkg/epp/scheduling: queue-scorer, kv-cache-utilization-scorer,
prefix-cache-scorer, max-score picker). None of them knows speculation: a worker whose drafts are accepted well
commits several tokens per step, one where they are not commits one. DeepSpec's workers publish their load with
their responses (deepspec_protocol/worker.py `WorkerLoad`) and the score is one physical quantity instead of a weighted
sum: the tokens per second the request would get there,

    expected = row rate with this request x acceptance ratio x slot share x KV headroom

- row rate with this request: what a running row commits per second on that worker (its step time, its
  acceptance, all in one measured number: `row_tokens_per_s`), at the rows it would run with this request. The
  worker measured the rate at `rate_rows` rows; a step of b rows is taken to cost 1 + ROW_COST (b - 1) one-row
  steps, which carries the rate to any other b. Comparing the per-row rates as reported put a burst on one worker:
  the one running a single row reported a single row's speed, the idle one the speed of the 8 rows it had last
  run, and every request of the burst went to the first while the second stayed idle;
- acceptance ratio: the request's class's τ on that worker over the worker's mean τ (1 where unknown), so a class
  whose drafts are accepted better somewhere goes there;
- slot share: slots / (slots + rows ahead of it), rows ahead being the waiting requests, the running ones past a full
  batch, and what this gateway sent there since the load was reported (so a burst between two reports spreads);
- KV headroom: 1 until the KV caches are `KV_HIGH` full, then falling to 0 at full.

Affinity: a request that names a session (OpenAI's `user`, the `x-session-id` header, gRPC `session_id`) goes to
the worker that served the session's last turn while that worker is admitted: its prompt-lookup and suffix
drafters, and its prefix reuse, hold the conversation. Requests without a session get approximate prefix affinity:
the worker that last served the same prompt prefix, while its score is within `PREFIX_AFFINITY_SLACK` of the best.
Both maps are bounded LRUs.

Fail-open: a worker's load older than `max_age_s` (it has served nothing lately, or it never reports: a stock Triton
or an OpenAI-HTTP engine) is stale; when any candidate's is, the pick is plain power of two choices on outstanding
requests, as before scoring existed.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from deepspec_protocol.worker import WorkerLoad

#: what a row joining a batch adds to its step, in one-row steps: the CPU decoder's 8-row step costs ~2.4 one-row
#: steps on AVX2 (0.2 a row), ~1.7 with AVX-512 (0.1); a GPU's much less. Only the ratio of two workers' scores
#: matters, so its error shifts a split between workers measured at different batch sizes, never its direction
ROW_COST = 0.2
#: KV utilisation past which a worker's score falls (to 0 at full): preemption or a refusal is near
KV_HIGH = 0.9
#: a prefix's worker keeps it while it scores at least this share of the best
PREFIX_AFFINITY_SLACK = 0.7
#: characters of a prompt that name its prefix (a system prompt, a few-shot block, a conversation's start)
PREFIX_CHARS = 512


def expected_tokens_per_s(load: WorkerLoad, service_class: str, sent_since: int) -> float:
    """The tokens per second a request of `service_class` would get from a worker with `load`, this gateway having
    sent it `sent_since` more requests than were running or waiting there when it reported `load`."""
    return LoadScore.of(load).tokens_per_s(service_class, sent_since)


@dataclass(frozen=True)
class LoadScore:
    """A load report with the parts of its score that no request changes worked out once, when it arrives: a pick
    scores every candidate worker for every request, and the report changes far less often."""

    load: WorkerLoad
    #: the measured row rate in one-row steps (row rate x its step's cost); 0 where the worker cannot serve
    one_row_rate: float
    #: KV headroom: 1 until KV_HIGH, falling to 0 at full
    headroom: float
    #: service class -> its τ over the worker's mean τ; a class not listed gets 1
    ratios: dict[str, float]

    @classmethod
    def of(cls, load: WorkerLoad) -> LoadScore:
        if load.row_tokens_per_s <= 0 or load.num_slots <= 0:
            return cls(load, 0.0, 0.0, {})
        mean_tau = sum(load.acceptance.values()) / len(load.acceptance) if load.acceptance else 0.0
        ratios = {c: tau / mean_tau for c, tau in load.acceptance.items() if tau and mean_tau}
        headroom = 1.0 if load.kv_utilization <= KV_HIGH else max(0.0, (1 - load.kv_utilization) / (1 - KV_HIGH))
        measured_rows = load.rate_rows or max(load.num_running, 1)  # a worker that does not say: its batch now
        return cls(load, load.row_tokens_per_s * _step_cost(measured_rows), headroom, ratios)

    def tokens_per_s(self, service_class: str, sent_since: int) -> float:
        """`expected_tokens_per_s` of this report."""
        load = self.load
        if not self.one_row_rate:
            return 0.0
        rows = load.num_running + max(0, sent_since) + 1
        rows_ahead = load.num_waiting + max(0, rows - load.num_slots)
        slot_share = load.num_slots / (load.num_slots + rows_ahead)
        row_rate = self.one_row_rate / _step_cost(min(rows, load.num_slots))
        return row_rate * self.ratios.get(service_class, 1.0) * slot_share * self.headroom


def _step_cost(rows: float) -> float:
    """A step of `rows` rows in one-row steps (ROW_COST)."""
    return 1.0 + ROW_COST * (max(rows, 1.0) - 1.0)


def prefix_key(prompt: str | None, messages: list[dict] | None) -> str | None:
    """A short digest of a prompt's opening (a chat's first messages): requests that share it share a prefix."""
    if messages:
        text = "\x00".join(f"{m['role']}\x01{m['content']}" for m in messages[:-1] or messages)
    else:
        text = prompt or ""
    if not text:
        return None
    return hashlib.blake2b(text[:PREFIX_CHARS].encode("utf-8", "replace"), digest_size=8).hexdigest()


class AffinityTable:
    """key (a session id, or a prefix digest) -> the worker that served it last; the `capacity` most recent kept."""

    def __init__(self, capacity: int = 65536):
        self.capacity = capacity
        self._workers: OrderedDict[str, str] = OrderedDict()

    def get(self, key: str | None) -> str | None:
        if key is None:
            return None
        worker = self._workers.get(key)
        if worker is not None:
            self._workers.move_to_end(key)
        return worker

    def put(self, key: str | None, worker: str) -> None:
        if key is None:
            return
        self._workers[key] = worker
        self._workers.move_to_end(key)
        if len(self._workers) > self.capacity:
            self._workers.popitem(last=False)
