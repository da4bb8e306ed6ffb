"""Routing by expected goodput: which worker gives a request the most tokens per second, and which one holds its
session's history.

The Gateway API Inference Extension's endpoint picker (and llm-d's scheduler on top of it) scores each pod with a
weighted sum of normalised signals scraped from its metrics: queue depth, KV-cache utilisation, a prefix-cache
match (gateway-api-inference-extension pkg/epp/scheduling: queue-scorer, kv-cache-utilization-scorer,
prefix-cache-scorer, max-score picker). None of them knows speculation: a worker whose drafts are accepted well
commits several tokens per step, one where they are not commits one. DeepSpec's workers publish their load with
their responses (deepspec_protocol/worker.py `WorkerLoad`) and the score is one physical quantity instead of a weighted
sum: the tokens per second the request would get there,

    expected = row_tokens_per_s x acceptance ratio x slot share x KV headroom

- row_tokens_per_s: what a running row commits per second on that worker now (its batch, its step time, its
  acceptance, all in one measured number);
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

from deepspec_protocol.worker import WorkerLoad

#: KV utilisation past which a worker's score falls (to 0 at full): preemption or a refusal is near
KV_HIGH = 0.9
#: a prefix's worker keeps it while it scores at least this share of the best
PREFIX_AFFINITY_SLACK = 0.7
#: characters of a prompt that name its prefix (a system prompt, a few-shot block, a conversation's start)
PREFIX_CHARS = 512


def expected_tokens_per_s(load: WorkerLoad, service_class: str, sent_since: int) -> float:
    """The tokens per second a request of `service_class` would get from a worker with `load`, this gateway having
    sent it `sent_since` more requests than were running or waiting there when it reported `load`."""
    if load.row_tokens_per_s <= 0 or load.num_slots <= 0:
        return 0.0
    mean_tau = sum(load.acceptance.values()) / len(load.acceptance) if load.acceptance else 0.0
    tau = load.acceptance.get(service_class)
    ratio = tau / mean_tau if tau and mean_tau else 1.0
    rows = load.num_running + max(0, sent_since) + 1
    rows_ahead = load.num_waiting + max(0, rows - load.num_slots)
    slot_share = load.num_slots / (load.num_slots + rows_ahead)
    headroom = 1.0 if load.kv_utilization <= KV_HIGH else max(0.0, (1 - load.kv_utilization) / (1 - KV_HIGH))
    return load.row_tokens_per_s * ratio * slot_share * headroom


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
