"""Speculative-decoding statistics from the server's own Prometheus counters, diffed across a run.

The client cannot see how many draft tokens the server accepted, so the load tester scrapes `GET /metrics`
before and after the measured requests and diffs the `deepspec:spec_decode_*` counters (summed over every
label set: `model`, `worker`, ...):

  mean acceptance length = 1 + accepted / drafts    (tokens emitted per verification step, bonus included)
  acceptance rate        = accepted / draft tokens
  per-position rate[i]   = accepted at position i / drafts

The diff covers everything the server did in between, so other traffic on the same server is counted too.
A server without these counters (a plain OpenAI-compatible server) gives `None`, not an error.
"""

from __future__ import annotations

import urllib.request
from collections import defaultdict
from dataclasses import asdict, dataclass, field

from prometheus_client.parser import text_string_to_metric_families

PREFIX = "deepspec:spec_decode_"
NUM_DRAFTS = "deepspec:spec_decode_num_drafts_total"
NUM_DRAFT_TOKENS = "deepspec:spec_decode_num_draft_tokens_total"
NUM_ACCEPTED_TOKENS = "deepspec:spec_decode_num_accepted_tokens_total"
NUM_ACCEPTED_PER_POS = "deepspec:spec_decode_num_accepted_tokens_per_pos_total"


@dataclass(slots=True)
class SpecCounters:
    """Counter values at one instant, summed over label sets."""

    num_drafts: float = 0.0
    num_draft_tokens: float = 0.0
    num_accepted_tokens: float = 0.0
    #: position (0-based, as the `position` label) -> accepted tokens at that position
    num_accepted_per_pos: dict[int, float] = field(default_factory=dict)
    #: False when the scrape had none of the counters (not a DeepSpec server, or speculation off)
    present: bool = False


@dataclass(slots=True)
class SpecDecodeStats:
    """The diff over a run; `acceptance_*` are None when no drafts happened."""

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    acceptance_rate: float | None
    acceptance_length: float | None
    per_position_acceptance_rate: list[float]

    def to_json(self) -> dict:
        return asdict(self)


def parse_counters(text: str) -> SpecCounters:
    """Sum the spec-decode counters in one Prometheus text exposition."""
    c = SpecCounters()
    per_pos: dict[int, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(PREFIX):
            continue
        for s in family.samples:
            # the parser strips `_total` from a counter's family name but keeps it on the sample.
            if s.name == NUM_DRAFTS:
                c.num_drafts += s.value
            elif s.name == NUM_DRAFT_TOKENS:
                c.num_draft_tokens += s.value
            elif s.name == NUM_ACCEPTED_TOKENS:
                c.num_accepted_tokens += s.value
            elif s.name == NUM_ACCEPTED_PER_POS and "position" in s.labels:
                per_pos[int(s.labels["position"])] += s.value
            else:
                continue
            c.present = True
    c.num_accepted_per_pos = dict(sorted(per_pos.items()))
    return c


def diff(before: SpecCounters, after: SpecCounters) -> SpecDecodeStats | None:
    """after - before as statistics; None when the server exports no spec-decode counters.

    A counter that went down means the server restarted during the run; the `after` value alone is then the
    best estimate (Prometheus' `rate()` makes the same assumption)."""
    if not after.present:
        return None

    def d(a: float, b: float) -> int:
        return int(round(a - b if a >= b else a))

    drafts = d(after.num_drafts, before.num_drafts)
    draft_tokens = d(after.num_draft_tokens, before.num_draft_tokens)
    accepted = d(after.num_accepted_tokens, before.num_accepted_tokens)
    last_pos = max(after.num_accepted_per_pos, default=-1)
    per_pos = [
        d(after.num_accepted_per_pos.get(p, 0.0), before.num_accepted_per_pos.get(p, 0.0)) / drafts if drafts else 0.0
        for p in range(last_pos + 1)
    ]
    return SpecDecodeStats(
        num_drafts=drafts,
        num_draft_tokens=draft_tokens,
        num_accepted_tokens=accepted,
        acceptance_rate=accepted / draft_tokens if draft_tokens else None,
        acceptance_length=1.0 + accepted / drafts if drafts else None,
        per_position_acceptance_rate=per_pos,
    )


def scrape(url: str, timeout_s: float = 5.0) -> str:
    """GET the Prometheus text at `url` (blocking; called only before and after a run)."""
    req = urllib.request.Request(url, headers={"Accept": "text/plain"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return resp.read().decode("utf-8", errors="replace")
