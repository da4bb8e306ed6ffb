"""Running prompts through the target: the chunked prefill forwards, prompt logprobs and each prompt's first token.

A `PrefillRunner` is the prefill phase of `SpecEngine.step()`: it groups the waiting prompts (prefill_plan.py), keeps
to the step's prefill budget while rows decode, runs each group — prompts of adjacent slots at one prefill position,
right-padded to the longest and cut into forwards of `chunk_size` tokens — and starts every prompt that completes as
a decoding row: its first token sampled from the last position's logits, the batch state and a KV drafter told its
prompt, the token committed. Slots stay the engine's: the forks of a request (OpenAI's `n`) are placed by the
engine, then started here from a copy of their parent's logits.
"""

from __future__ import annotations

from collections.abc import Callable, Container

import torch

from deepspec.decoding.batch_state import BatchState
from deepspec.decoding.drafter import KVDrafter
from deepspec.decoding.logprobs import scored_logits, token_logprobs
from deepspec.decoding.params import StepOutput
from deepspec.decoding.prefill_plan import prefill_runs
from deepspec.decoding.sequence import SequenceState
from deepspec.decoding.structured import mask_logits_
from deepspec.decoding.verify import RowSampling, sample_next
from deepspec.models.target import SlotCache, Target

#: a completed prompt whose forks start from it: (the sequence, its last position's logits [1, V], its features
#: [1, n, F] or None)
CompletedPrompt = tuple[SequenceState, torch.Tensor, torch.Tensor | None]
#: the engine's fork placement: a parent whose prefill completed → its forks, each now in a slot with the parent's KV
PlaceForks = Callable[[SequenceState], list[SequenceState]]


class PrefillRunner:
    """Prefills groups of prompts into the engine's cache and starts their sequences (the module docstring)."""

    def __init__(
        self,
        target: Target,
        cache: SlotCache,
        batch_state: BatchState,
        kv_drafter: KVDrafter | None,
        *,
        chunk_size: int,
        feature_layers: tuple[int, ...],
        max_seq_len: int,
    ):
        self.target = target
        self.cache = cache
        self.batch_state = batch_state
        self.kv_drafter = kv_drafter
        self.chunk_size = chunk_size
        self.feature_layers = feature_layers
        self.max_seq_len = max_seq_len
        #: prompt tokens run through the target so far (a fork, started from its parent's, adds none)
        self.tokens_computed = 0

    def step(
        self, running: list[SequenceState], budget: int | None, forked: Container[str], place_forks: PlaceForks
    ) -> list[StepOutput]:
        """Prefill the waiting sequences among `running` (slot order) in groups (prefill_plan.prefill_runs). With a
        budget (rows are decoding): at most `budget` padded tokens this step; a group that does not fit goes on with
        its first row only, in chunks across steps, and the rows behind it wait, so rows complete in slot order.
        None: every waiting prompt whole. `forked` names the requests with forks waiting on their prefill."""
        outputs: list[StepOutput] = []
        for group in _waiting_groups(running):
            if budget is None:
                outputs += self._run_group(group, None, forked, place_forks)
                continue
            if budget <= 0:
                break
            width = max(len(s.prompt) - s.prefill_pos for s in group)
            cut = width * len(group) > budget and len(group) > 1
            if cut:
                group = group[:1]
                width = len(group[0].prompt) - group[0].prefill_pos
            outputs += self._run_group(group, budget, forked, place_forks)
            budget -= min(width, budget) * len(group)
            if cut or not group[0].prefilled:
                break
        return outputs

    def _run_group(
        self, seqs: list[SequenceState], max_tokens: int | None, forked: Container[str], place_forks: PlaceForks
    ) -> list[StepOutput]:
        """Prefill one group (`_prefill_group`), then start the forks of each parent that completed, after the whole
        group (its rows are then the prefilled prefix the engine places forks behind), each from a copy of its parent's
        logits."""
        outputs, completed = self._prefill_group(seqs, max_tokens, forked)
        for parent, parent_logits, features in completed:
            for fork in place_forks(parent):
                outputs.append(self._start(fork, parent_logits.clone(), features))
        return outputs

    def _prefill_group(
        self, seqs: list[SequenceState], max_tokens: int | None, forked: Container[str]
    ) -> tuple[list[StepOutput], list[CompletedPrompt]]:
        """Prefill sequences of adjacent slots at one prefill position in one batch, up to `max_tokens` positions
        further (None: to the end), and start each one that completes. What a sequence needs across steps (its draft
        features, its prompt's logprobs) waits on the sequence. → (the started sequences' outputs, the completed
        prompts whose request id is in `forked`, with a copy of their logits taken before anything masks them)."""
        lengths = [len(s.prompt) for s in seqs]
        start, width = seqs[0].prefill_pos, max(lengths)
        end = width if max_tokens is None else min(width, start + max_tokens)
        logits = self._forward(seqs, start, end)
        outputs: list[StepOutput] = []
        completed: list[CompletedPrompt] = []
        for row, seq in enumerate(seqs):
            self.tokens_computed += max(0, min(end, lengths[row]) - seq.prefill_pos)
            seq.prefill_pos = seq.cache_len = min(end, lengths[row])
            if seq.prefill_pos == lengths[row]:
                features = torch.cat(seq.prefill_features, 1)[:, : lengths[row]] if seq.prefill_features else None
                seq.prefill_features = []
                if seq.request_id in forked:
                    completed.append((seq, logits[row : row + 1].clone(), features))
                outputs.append(self._start(seq, logits[row : row + 1], features))
        return outputs, completed

    def _forward(self, seqs: list[SequenceState], start: int, end: int) -> torch.Tensor:
        """Run positions [start, end) of the group's right-padded prompts through the target in chunks → each row's
        last prompt position's logits [B, V] (rows whose prompt ends past `end` leave theirs unset), scoring the
        prompts of rows that ask for prompt logprobs and keeping every chunk's draft features on its sequence."""
        device = self.target.device
        lengths = [len(s.prompt) for s in seqs]
        width = max(lengths)
        prompts = torch.tensor(
            [s.prompt + [0] * (width - len(s.prompt)) for s in seqs], dtype=torch.long, device=device
        )
        last = torch.tensor(lengths, device=device) - 1
        view = self.cache.rows(seqs[0].slot, len(seqs))
        logits = torch.empty(len(seqs), self.target.vocab_size, device=device)
        #: rows that score their prompt need every position's logits; the others only their last one's
        scored = [row for row, s in enumerate(seqs) if s.params.prompt_logprobs is not None]
        for row in scored:
            if seqs[row].prompt_logprobs is None:
                seqs[row].prompt_logprobs = [None]  # nothing predicts the first prompt token
        for a in range(start, end, self.chunk_size):
            b = min(a + self.chunk_size, end)
            ends_here = (last >= a) & (last < b)
            at_last = (last - a).clamp(0, b - a - 1)
            wanted = "all" if scored else (at_last if bool(ends_here.any()) else "none")
            out = self.target.forward(
                prompts[:, a:b],
                torch.full((len(seqs),), a, device=device),
                view,
                feature_layers=self.feature_layers,
                logits=wanted,
                max_start=a,
            )
            if out.logits is not None:
                chunk_logits = (
                    out.logits
                    if not scored
                    else out.logits.gather(1, at_last[:, None, None].expand(-1, 1, out.logits.shape[2]))
                )
                logits[ends_here] = chunk_logits[ends_here, 0]
            for row in scored:  # position p predicts prompt token p + 1
                stop = min(b, lengths[row] - 1)
                if stop > a:
                    _score_prompt(seqs[row], out.logits, row, prompts[row, a + 1 : stop + 1])
            if out.features is not None:
                for row, seq in enumerate(seqs):
                    seq.prefill_features.append(out.features[row : row + 1])
        return logits

    def _start(self, seq: SequenceState, logits: torch.Tensor, feats: torch.Tensor | None) -> StepOutput:
        """The prompt is in the cache: sample its first token from the last position's logits [1, V], give the
        batch state and the drafter the prompt and its features [1, n, F] (None without), and commit."""
        if seq.grammar is not None:
            mask_logits_(logits, seq.grammar.root_mask())
        first = _first_token(seq, logits[0])
        first_logprobs = None
        if seq.params.logprobs is not None:
            first_logprobs = token_logprobs(
                scored_logits(logits, [seq.params]), torch.tensor([first]), seq.params.logprobs
            )
        seq.prefilled, seq.pending = True, first
        self.batch_state.append(seq.slot, seq.prompt + [first])
        if self.kv_drafter is not None:
            self.kv_drafter.start(seq.slot, seq.prompt + [first], feats)
        if seq.params.max_tokens == 0:  # prompt scoring only: nothing is generated
            seq.finish_reason = "length"
        out = seq.commit([first] if seq.params.max_tokens else [], first_logprobs, self.max_seq_len)
        if seq.prompt_logprobs is not None:
            out.prompt_logprobs = seq.prompt_logprobs
        return out


def _waiting_groups(running: list[SequenceState]) -> list[list[SequenceState]]:
    """The sequences waiting on their prefill, grouped for prefill forwards (prefill_plan.prefill_runs)."""
    waiting = [s for s in running if not s.prefilled]
    runs = prefill_runs([(s.slot, s.prefill_pos, len(s.prompt) - s.prefill_pos) for s in waiting])
    return [[waiting[i] for i in run] for run in runs]


def _score_prompt(seq: SequenceState, logits: torch.Tensor | None, row: int, targets: torch.Tensor) -> None:
    """Append the logprobs of prompt tokens `targets` [N] to a scoring row's prompt_logprobs; `logits` is the
    chunk's [B, >= N, V], there because a scored prefill asks for every position's."""
    num_top = seq.params.prompt_logprobs
    assert logits is not None and num_top is not None and seq.prompt_logprobs is not None
    seq.prompt_logprobs += token_logprobs(logits[row, : len(targets)], targets, num_top)


def _first_token(seq: SequenceState, logits: torch.Tensor) -> int:
    """The token after the prompt, from its last position's logits [V]: the argmax, or a draw from the request's
    own generator."""
    p = seq.params
    if p.greedy:
        return int(logits.argmax())
    return int(sample_next(logits[None], RowSampling.draw([p], [seq.generator], logits.device))[0])
