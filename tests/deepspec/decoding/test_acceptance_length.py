"""One τ: the engine's stats, eval's summary, the worker's RequestStats and its acceptance-length histogram count
the same rounds — those that verified at least one draft. A round left without drafts (by the verify budget or an
empty proposal) commits the target's token alone and would pull a per-pass mean towards 1."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from deepspec.decoding import SamplingParams, SpecEngine
from deepspec.decoding.drafter import Drafter, DraftSampling, Proposal
from deepspec.decoding.params import AcceptanceStats
from deepspec_protocol.worker import RequestStats
from service.metrics import (
    SPEC_DECODE_ACCEPTANCE_LENGTH,
    SPEC_DECODE_NUM_FORWARD_TOKENS_TOTAL,
    SPEC_DECODE_NUM_FORWARDS_TOTAL,
    WorkerMetrics,
)
from tests.conftest import make_tiny_target
from training.evaluate import summarize

PROMPT = [1, 2, 3, 1, 2]
#: 1 token from the prefill, then 4 × (a drafted round committing 3 + an empty round committing 1)
MAX_TOKENS = 17


class _EveryOtherRound(Drafter):
    """Knows the target's greedy continuation; on every other round proposes its next two tokens and a wrong
    third (2 accepted, so 3 committed), on the rounds between proposes nothing."""

    name = "every-other-round"

    def __init__(self, continuation: list[int], vocab: int):
        self.continuation, self.vocab = continuation, vocab
        self.num_calls = 0

    def propose(self, view, slots, k, sampling: DraftSampling) -> Proposal:
        self.num_calls += 1
        committed = view.num_tokens(slots[0]) - len(PROMPT)  # the view holds the prompt, then the output
        right = self.continuation[committed : committed + 2]
        tokens = torch.tensor([right + [(right[1] + 1) % self.vocab]])
        drafted = self.num_calls % 2 == 1
        return Proposal.from_rows(tokens, torch.tensor([3 if drafted else 0]))


@pytest.fixture(scope="module")
def run():
    """One request through the engine: its GenerationResult and every StepOutput it streamed."""
    target = make_tiny_target(eos=False, temperature=4.0)[0]
    params = SamplingParams(max_tokens=MAX_TOKENS)
    reference = (
        SpecEngine(target, None, max_batch_size=1, max_seq_len=128)
        .generate([PROMPT], SamplingParams(max_tokens=MAX_TOKENS + 8))[0]
        .token_ids
    )
    engine = SpecEngine(
        target, _EveryOtherRound(reference, 16), max_batch_size=1, max_seq_len=128, num_speculative_tokens=3
    )
    outputs = []
    result = engine.generate([PROMPT], params, on_output=outputs.append)[0]
    assert result.token_ids == reference[:MAX_TOKENS]  # greedy verification stays lossless
    return result, outputs


def test_tau_counts_only_the_rounds_that_verified_drafts(run):
    result, _ = run
    assert (result.num_steps, result.num_drafted_steps, result.num_accepted_tokens) == (8, 4, 8)
    assert result.acceptance_length == 3.0  # (8 accepted + 4 drafted rounds) / 4; per verify pass it would be 2.0
    assert result.verify_tokens_per_step == (4 * 4 + 4 * 1) / 8  # what the passes scored stays per pass


def test_engine_eval_and_worker_agree_on_one_run(run):
    result, outputs = run
    stats, metrics = RequestStats(), WorkerMetrics("m")
    for out in outputs:  # as service/worker/scheduler.py folds each StepOutput into the request's stats
        stats = replace(
            stats,
            num_output_tokens=stats.num_output_tokens + len(out.new_token_ids),
            num_draft_tokens=stats.num_draft_tokens + out.num_draft_tokens,
            num_accepted_tokens=stats.num_accepted_tokens + out.num_accepted_tokens,
            num_spec_steps=stats.num_spec_steps + int(out.num_draft_tokens > 0),
        )
        if out.num_verify_tokens:  # as the scheduler: every decode round, drafted or not
            metrics.observe_decode_round(out.num_accepted_tokens)
        if out.num_draft_tokens > 0:
            metrics.observe_spec_round(out.num_draft_tokens, out.num_accepted_tokens)
    histogram = {
        s.name.removeprefix(SPEC_DECODE_ACCEPTANCE_LENGTH): s.value
        for m in metrics.registry.collect()
        if m.name == SPEC_DECODE_ACCEPTANCE_LENGTH
        for s in m.samples
    }
    tau, _, _ = summarize([result])
    mean_observed = histogram["_sum"] / histogram["_count"]
    assert result.acceptance_length == tau == stats.acceptance_length == mean_observed == 3.0
    assert stats.num_spec_steps == result.num_drafted_steps == 4
    counted = {m.name: sum(s.value for s in m.samples if s.name.endswith("_total")) for m in metrics.registry.collect()}
    forwards = counted[SPEC_DECODE_NUM_FORWARDS_TOTAL.removesuffix("_total")]
    forward_tokens = counted[SPEC_DECODE_NUM_FORWARD_TOKENS_TOTAL.removesuffix("_total")]
    assert forwards == result.num_steps == 8  # the empty rounds too
    assert forward_tokens / forwards == result.tokens_per_forward == 2.0  # (8 accepted + 8 rounds) / 8


def test_a_request_that_never_drafted_has_no_tau():
    stats = AcceptanceStats()
    for _ in range(3):
        stats.record(num_drafts=0, num_accepted=0)
    assert stats.num_steps == 3 and stats.acceptance_length is None and summarize([stats])[0] is None
    assert RequestStats().acceptance_length is None  # the worker says the same before any draft


def test_tokens_per_forward_counts_every_round_where_tau_counts_drafted_ones():
    """τ of a draft that drafts one round in ten is the τ of that round; tokens per forward says what the nine empty
    rounds cost: 4 drafts accepted over 10 passes commit 14 tokens, 1.4 a pass, against τ = 5."""
    stats = AcceptanceStats()
    stats.record(4, 4)
    for _ in range(9):
        stats.record(0, 0)
    assert stats.acceptance_length == 5.0
    assert stats.tokens_per_forward == pytest.approx(1.4)
    assert AcceptanceStats().tokens_per_forward is None
