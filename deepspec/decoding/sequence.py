"""One running sequence as the engine keeps it: its request, its slot, what it has committed, and its commit rule.

The engine (deepspec/decoding/engine.py) holds one `SequenceState` per request from `add_request` until it
finishes; drafters never see it (they read the batch state). `commit` is where every generated token passes: the
stop conditions, the grammar, the detokenizer and the logprobs are applied in one place for prefill and rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from deepspec.decoding.detokenizer import IncrementalDetokenizer
from deepspec.decoding.logprobs import TokenLogprob
from deepspec.decoding.params import AcceptanceStats, SamplingParams, StepOutput
from deepspec.decoding.structured import RowGrammar
from deepspec.decoding.verify_budget import EstimateCalibration


@dataclass
class SequenceState:
    request_id: str
    params: SamplingParams
    prompt: list[int]
    slot: int
    #: names the sequence in the engine's batch state for as long as it runs (batch_state.BatchView.sequence_id)
    sequence_id: int
    #: draws on the host: the first token, each verify step's seeds, each round's draft seed
    generator: torch.Generator
    #: the drafts' draws, reseeded every round (`_draft_sampling`): on the host, and on the target's device
    #: (the same generator on a CPU target)
    draft_generator: torch.Generator
    draft_device_generator: torch.Generator
    detokenizer: IncrementalDetokenizer
    stop_ids: frozenset[int]
    keep_result: bool = False
    output: list[int] = field(default_factory=list)
    #: positions of this sequence already in the KV cache; `pending` is committed but not yet fed
    cache_len: int = 0
    pending: int = -1
    prefilled: bool = False
    #: prompt tokens already in the KV cache (a long prompt is prefilled in chunks across steps)
    prefill_pos: int = 0
    #: the target features of the prompt's chunks so far, for the drafter once the prefill completes
    prefill_features: list = field(default_factory=list)
    finish_reason: str | None = None
    stats: AcceptanceStats = field(default_factory=AcceptanceStats)
    #: aligned with output when the request asked for logprobs
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    #: the request's structured-output matcher, advanced over `output` (None = unconstrained)
    grammar: RowGrammar | None = None
    #: committed (tokens, the target features before them) the KV drafter has not heard yet (SpecEngine._tell_drafter)
    unheard: list = field(default_factory=list)
    #: how the drafter's own survival estimates hold for this greedy sequence (verify_budget.EstimateCalibration)
    calibration: EstimateCalibration = field(default_factory=EstimateCalibration)

    def hold_unheard(self, tokens: list[int], features: torch.Tensor | None) -> None:
        """Committed tokens (and the features before each, [n, F]) the KV drafter has not heard yet."""
        self.unheard.append((tokens, features))

    @property
    def num_unheard(self) -> int:
        return sum(len(chunk) for chunk, _ in self.unheard)

    def commit(self, tokens: list[int], logprobs: list[TokenLogprob] | None, max_seq_len: int) -> StepOutput:
        """Append committed tokens (and their logprobs, aligned) up to the first stop condition (a stop token or
        string, max_tokens, the grammar's end, `max_seq_len`); return what to stream."""
        seq = self
        kept, stop_index = [], None
        for i, token in enumerate(tokens):
            if token in seq.stop_ids:
                seq.finish_reason, stop_index = "stop", i
                break
            kept.append(token)
            if len(seq.output) + len(kept) >= seq.params.max_tokens:
                seq.finish_reason = "length"
                break
        if seq.grammar is not None:
            kept = kept[: seq.grammar.accept(kept)]
            if seq.grammar.dead:  # no token of this vocabulary can go on (structured.py's dead ends)
                seq.finish_reason = "abort"
            elif seq.grammar.terminated and not seq.finish_reason:  # the constrained output is complete
                seq.finish_reason = "stop"
        text, stop_at = seq.detokenizer.add(kept)
        if stop_at is not None:
            kept = kept[: stop_at + 1]
            seq.finish_reason = "stop"
        seq.output.extend(kept)
        if not seq.finish_reason and seq.cache_len + 1 >= max_seq_len:
            seq.finish_reason = "length"
        if seq.finish_reason and stop_at is None:
            text += seq.detokenizer.flush()
        kept_logprobs = stop_logprob = None
        if seq.logprobs is not None:
            kept_logprobs = list(logprobs or [])[: len(kept)]
            seq.logprobs.extend(kept_logprobs)
            if stop_index is not None and stop_index == len(kept) and logprobs and len(logprobs) > stop_index:
                stop_logprob = logprobs[stop_index]  # the stop token right after what is kept
        return StepOutput(
            seq.request_id,
            kept,
            text,
            seq.finish_reason is not None,
            seq.finish_reason,
            logprobs=kept_logprobs,
            stop_logprob=stop_logprob,
        )


def take_unheard(seqs: list[SequenceState]) -> tuple[list[list[int]], torch.Tensor | None]:
    """What each sequence holds back from its KV drafter, emptied: its tokens, and their features padded to one
    length [len(seqs), n, F] (None where the drafter reads no features)."""
    tokens = [sum((chunk for chunk, _ in seq.unheard), []) for seq in seqs]
    features = None
    if seqs[0].unheard[0][1] is not None:
        parts = [torch.cat([f for _, f in seq.unheard]) for seq in seqs]
        features = torch.nn.utils.rnn.pad_sequence(parts, batch_first=True)
    for seq in seqs:
        seq.unheard = []
    return tokens, features


def fork_parent(parent: SequenceState | None, parent_id: str, prompt: list[int]) -> SequenceState:
    """The waiting request a fork (OpenAI's `n`) shares its prompt with; ValueError when there is none to share."""
    if parent is None or parent.slot < 0:
        raise ValueError(
            f"fork_of={parent_id!r}: no such request is running (a fork's parent must be a request "
            "that is not itself a fork)"
        )
    if parent.prefilled:
        raise ValueError(f"fork_of={parent_id!r}: its prefill is complete; fork a request before its first step")
    if parent.prompt != prompt:
        raise ValueError(f"fork_of={parent_id!r}: a fork shares its parent's prompt, and this one differs")
    return parent
