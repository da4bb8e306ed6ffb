"""The speculative decoding engine: prefill → (propose → verify → accept → stream) until each request stops.

`SpecEngine.step()` is one scheduler iteration over every running sequence: newly added requests are prefilled
(emitting their first token), then all running rows take one batched round — the drafter proposes up to k
tokens per row, the target scores [last token, drafts] in a single forward, each row accepts its own number of
drafts and commits one more token of the target's. With no drafter the same loop is the target-only baseline.

A drafter may propose a token tree instead of a chain (deepspec/decoding/drafter.py): the target then scores the
root and every node in one forward with tree attention, `tree_accept` picks each row's accepted root-to-node path,
and `compact_kv` moves that path's KV entries next to the committed prefix (the KV cache's `keep_path`,
deepspec/models/kv_cache.py; the tree bookkeeping is deepspec/decoding/tree.py). A target
without tree attention verifies each tree's chain of first children. `num_speculative_tokens` is the node budget
per row either way: the depth of a chain, the size of a tree.

State: the engine owns every running row's committed tokens, slot and sampling parameters in one `BatchState`
(deepspec/decoding/batch_state.py); drafters read it through a read-only view and return a ragged Proposal, which
the round pads once for the batched ops. Only a drafter with a KV cache of its own (a KVDrafter) hears commits and
slot moves.

Devices: what the target and a neural draft compute stays on the target's device; the bookkeeping around it
(proposals' tokens and trees, budgets, committed ids) is small CPU tensors, moved across where the two meet. Each
request has its own CPU generator (its first token, each verify step's seeds) and a pair for its drafts: a CPU one
(corpus trees) and one on the target's device (a neural draft's sampled tokens: torch draws a CUDA tensor only with a
CUDA generator), both reseeded every round from one draw of the request's own. A draft proposes as many tokens as
the batch's longest cap asks, so without the reseeding a co-runner would shift this request's random stream; with
it, draws past the request's own cap only come at the end of a stream that is thrown away.
tests/deepspec/decoding/test_device_consistency.py runs every drafter on a CUDA target made of CPU tensors.

Several sequences from one prompt (OpenAI's `n`): `add_request(..., fork_of=parent_id)` adds a sequence that shares
a waiting request's prompt. It takes no prefill of its own: when the parent's prefill completes, its KV entries are
copied into the fork's slot (the slot cache's `move_slot` is a copy), the fork samples its own first token from the
same last-position logits with its own generator, and from then on it is drafted, verified and sampled as any other
row. `prompt_tokens_computed` counts the prompt tokens the target ran, so a test or a benchmark sees n sequences
cost one prefill.

Requests may join (`add_request`) and leave (finish, `abort`) between steps: continuous batching. The engine is
not thread-safe; a server drives it from one thread (only `validate` may be called from others). It decodes text only
through `target.decode`, to detokenize incrementally and to honour stop strings. Bad requests raise `RequestError`
with a typed code (deepspec/decoding/validation.py), checked here once for every server.
"""

from __future__ import annotations

import itertools
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from deepspec.decoding.batch_state import BatchState, new_sequence_id
from deepspec.decoding.detokenizer import IncrementalDetokenizer
from deepspec.decoding.draft_time import probe_draft_time, runs_a_model
from deepspec.decoding.drafter import DraftSampling, Drafter, KVDrafter, PaddedProposal
from deepspec.decoding.logprobs import TokenLogprob, scored_logits, token_logprobs
from deepspec.decoding.phases import PhaseTimer, untimed
from deepspec.decoding.params import AcceptanceStats, GenerationResult, SamplingParams, StepOutput
from deepspec.decoding.structured import GrammarCompiler, RowGrammar, mask_logits_, restrict_draft_probs
from deepspec.decoding.tree import (first_children, keep_nodes, monotone_survival, node_depths,
                                    tree_survival_from_record, with_root)
from deepspec.decoding.validation import RequestError, RequestErrorCode, validate_request
from deepspec.decoding.verify import RowSampling, fresh_seed, sample_next, verify, verify_result, verify_tree
from deepspec.decoding.verify_budget import (AcceptanceHistory, DraftTimeModel, EstimateCalibration, StepTimeModel,
                                            best_depth, best_nodes, observed_survival)
from deepspec.models.target import Target
from deepspec.models.tree_attention import check_parents


class EngineFullError(RuntimeError):
    """Every slot is taken; retry after a request finishes (servers answer 429 / queue it)."""


@dataclass
class _Sequence:
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


class SpecEngine:
    def __init__(
        self,
        target: Target,
        drafter: Drafter | None = None,
        *,
        max_batch_size: int = 8,
        max_seq_len: int = 2048,
        num_speculative_tokens: int = 7,
        prefill_chunk_size: int = 512,
        max_verify_tokens: int = 32,
        prefill_tokens_per_step: int | None = None,
        verify_budget: bool = True,
        price_drafting: bool = True,
        seed: int = 0,
    ):
        if max_batch_size < 1 or num_speculative_tokens < 0 or max_seq_len < 2:
            raise ValueError("need max_batch_size >= 1, num_speculative_tokens >= 0 and max_seq_len >= 2")
        self.target = target
        self.drafter = drafter
        #: torch's intra-op threads while a step runs, where the target asks for its own count (`host_threads`, an
        #: optional member: OnnxTarget's forward runs in ONNX Runtime's pool, see _torch_threads); None = torch's
        self._host_threads: int | None = getattr(target, "host_threads", None)
        self.max_batch_size = max_batch_size
        self.max_seq_len = min(max_seq_len, target.max_seq_len)
        #: drafts verified per row and round at most: chain slots, or tree nodes (the cache slack below fits them)
        self.num_speculative_tokens = num_speculative_tokens if drafter is not None else 0
        self.prefill_chunk_size = prefill_chunk_size
        #: tokens one verify pass may score across all rows; past it a batched forward stops being memory-bound on
        #: CPU and every extra draft slot costs real time, so large batches draft shorter blocks
        self.max_verify_tokens = max_verify_tokens
        #: prompt tokens a step may prefill while rows decode (chunked prefill across steps); by default a decode
        #: round's own verify tokens, so a long prompt arriving at most about doubles the running streams' step time
        self.prefill_tokens_per_step = prefill_tokens_per_step or max_verify_tokens
        self.feature_layers = tuple(drafter.feature_layers) if drafter is not None else ()
        #: token trees are verified in one pass with tree attention; otherwise as each tree's chain of first children
        self.tree_attention = bool(getattr(target, "supports_tree_attention", False))
        # slack past max_seq_len: padded draft slots of a row near its limit still have somewhere to go
        self.cache = target.new_cache(max_batch_size, self.max_seq_len + self.num_speculative_tokens + 1)
        if drafter is not None:
            drafter.bind(target, max_batch_size, self.max_seq_len)
        #: every slot's committed tokens and sampling parameters, the one record drafters read (batch_state.py)
        self.batch_state = BatchState(max_batch_size, self.max_seq_len + self.num_speculative_tokens + 2,
                                      target.device)
        #: the drafter's commit and slot-move hooks, for drafters with state of their own (None = it reads the view)
        self._kv_drafter = drafter if isinstance(drafter, KVDrafter) else None
        #: verify-pass cost model of the verification budget (None = verify every capped draft); drafters that do
        #: not estimate their survival are budgeted on each sequence's own acceptance record
        self.step_time: StepTimeModel | None = None
        if drafter is not None and verify_budget and self.num_speculative_tokens:
            self.step_time = self._recorded_step_time() or self._probe_step_time()
        #: greedy (False) / sampled (True) -> seconds the acceptance op costs a round beyond a target-only one,
        #: priced with each drafted depth (`_budget_depth`, `_probe_verify_overhead` says why)
        self._verify_overhead: dict[bool, float] | None = (
            self._probe_verify_overhead() if self.step_time is not None else None)
        #: what a drafted round costs the drafter, priced with the verify pass before a round drafts (`_draft_width`);
        #: None for a drafter that runs no model of its own (nothing to time) and with `price_drafting=False`, where
        #: every round asks the drafter and the budget cuts only its drafts (training/curve.py turns the whole budget
        #: off instead: `verify_budget=False`)
        self.draft_time: DraftTimeModel | None = None
        if price_drafting and self.step_time is not None and runs_a_model(drafter):
            self.draft_time = self._probe_draft_time()
        #: width -> this round's observed survival (_observed_survival)
        self._round_survival: dict[int, list[list[float]]] = {}
        self._rng = torch.Generator().manual_seed(seed)
        self._eos = frozenset(target.eos_token_ids)
        self._running: list[_Sequence] = []  # index == slot
        #: the rows of the decode round in progress: the prefilled prefix of _running
        self._batch: list[_Sequence] = []
        #: the finished sequences' acceptance, the prior a new sequence's own record starts from
        self.acceptance_history = AcceptanceHistory()
        self._by_id: dict[str, _Sequence] = {}
        #: waiting request id -> the sequences forked from its prompt, placed in slots when its prefill completes
        self._forks: dict[str, list[_Sequence]] = {}
        #: prompt tokens run through the target so far (forks share their parent's)
        self.prompt_tokens_computed = 0
        self._finished: dict[str, _Sequence] = {}  # only requests added with keep_result=True
        #: the context each step phase runs in: untimed unless `profile` is on (deepspec/decoding/phases.py)
        self._phase = untimed

    # ---- admission ---------------------------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        """Sequences holding a slot, forks waiting on their parent's prefill included."""
        return len(self._running) + sum(len(forks) for forks in self._forks.values())

    @property
    def num_free_slots(self) -> int:
        return self.max_batch_size - self.num_running

    def has_unfinished(self) -> bool:
        return bool(self._running)

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise RequestError (a ValueError with a RequestErrorCode) unless the request fits this engine; called by
        add_request, and by servers before they queue a request. Reads only fixed settings: safe from any thread."""
        validate_request(prompt_token_ids, params.max_tokens, max_seq_len=self.max_seq_len,
                         vocab_size=self.target.vocab_size)
        if params.structured is not None:
            self._grammar_compiler().check(params.structured)

    def _grammar_compiler(self) -> GrammarCompiler:
        """One per target in a process: compiling against a vocabulary costs seconds the first time."""
        if self.target not in _GRAMMAR_COMPILERS:
            _GRAMMAR_COMPILERS[self.target] = GrammarCompiler(self.target)
        return _GRAMMAR_COMPILERS[self.target]

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    keep_result: bool = False, fork_of: str | None = None) -> None:
        """Queue a request for the next step; keep_result=True keeps its record for `pop_result`. `fork_of` names a
        waiting request with the same prompt: this sequence then shares its prefill (the module docstring)."""
        if request_id in self._by_id:
            raise RequestError(RequestErrorCode.REQUEST_ID_IN_USE, f"request id '{request_id}' is already running")
        prompt = list(prompt_token_ids)
        self.validate(prompt, params)
        if self.num_free_slots == 0:
            raise EngineFullError(f"all {self.max_batch_size} slots are busy")
        parent = self._fork_parent(fork_of, prompt) if fork_of is not None else None
        seed = params.seed if params.seed is not None else fresh_seed(self._rng)
        stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self._eos)
        generator = torch.Generator().manual_seed(seed)
        device = self.target.device
        draft_generator = torch.Generator()
        seq = _Sequence(
            request_id=request_id,
            params=params,
            prompt=prompt,
            slot=len(self._running),
            sequence_id=new_sequence_id(),
            generator=generator,
            draft_generator=draft_generator,
            draft_device_generator=draft_generator if device.type == "cpu" else torch.Generator(device=device),
            detokenizer=IncrementalDetokenizer(self.target.decode, params.stop),
            stop_ids=stop_ids,
            keep_result=keep_result,
            logprobs=[] if params.logprobs is not None else None,
            grammar=self._grammar_compiler().matcher(params.structured) if params.structured is not None else None,
        )
        if params.greedy:  # a sampled row's depths decide its draws: they must not follow the engine's history
            seq.calibration = self.acceptance_history.calibration(seq.sequence_id)
        if parent is not None:
            seq.slot = -1  # placed when the parent's prefill completes
            self._forks.setdefault(parent.request_id, []).append(seq)
        else:
            self._running.append(seq)
            self.batch_state.admit(seq.slot, seq.sequence_id, params)
        self._by_id[request_id] = seq

    def _fork_parent(self, parent_id: str, prompt: list[int]) -> _Sequence:
        """The waiting request a fork shares its prompt with; ValueError when there is none to share."""
        parent = self._by_id.get(parent_id)
        if parent is None or parent.slot < 0:
            raise ValueError(f"fork_of={parent_id!r}: no such request is running (a fork's parent must be a request "
                             "that is not itself a fork)")
        if parent.prefilled:
            raise ValueError(f"fork_of={parent_id!r}: its prefill is complete; fork a request before its first step")
        if parent.prompt != prompt:
            raise ValueError(f"fork_of={parent_id!r}: a fork shares its parent's prompt, and this one differs")
        return parent

    def abort(self, request_id: str) -> bool:
        seq = self._by_id.get(request_id)
        if seq is None:
            return False
        seq.finish_reason = "abort"
        if seq.slot < 0:  # a fork still waiting on its parent's prefill holds no slot yet
            for forks in self._forks.values():
                if seq in forks:
                    forks.remove(seq)
            self._forget(seq)
            return True
        self._release([seq])
        return True

    def profile(self) -> PhaseTimer:
        """Time every step's phases from now on (deepspec/decoding/phases.py); → the timer that accumulates them."""
        timer = PhaseTimer(self.target.device)
        self._phase = timer
        return timer

    # ---- one scheduler iteration -------------------------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        with self._phase("step"), _torch_threads(self._host_threads):
            return self._step()

    @torch.inference_mode()
    def _step(self) -> list[StepOutput]:
        """Prefill, then one decode round over the rows whose prefill is complete. While rows decode, the prefill
        of new prompts takes at most `prefill_tokens_per_step` prompt tokens per step (chunked prefill across steps,
        as vLLM's): a long prompt arriving costs each running stream one chunk's time per step, never its whole
        prefill. With nothing decoding, prompts are prefilled whole (in forwards of prefill_chunk_size tokens): no
        one is waiting."""
        outputs: dict[str, StepOutput] = {}
        with self._phase("prefill"):
            for out in self._prefill_step(budgeted=self._num_decoding() > 0):
                outputs[out.request_id] = out
        with self._phase("release"):
            self._release([s for s in self._running if s.finish_reason])
        decoding = self._num_decoding()
        if decoding:
            self._batch = self._running[:decoding]
            for out in self._decode_round():
                if out.request_id in outputs:
                    _merge(outputs[out.request_id], out)
                else:
                    outputs[out.request_id] = out
            with self._phase("release"):
                self._release([s for s in self._running if s.finish_reason])
        return list(outputs.values())

    def _num_decoding(self) -> int:
        """How many rows have finished their prefill: always the first slots (prefill completes in slot order and
        `_release` keeps the prefilled rows in front), so a decode round reads its cache rows as one view."""
        return next((i for i, s in enumerate(self._running) if not s.prefilled), len(self._running))

    def _prefill_step(self, budgeted: bool) -> list[StepOutput]:
        """Prefill waiting prompts in slot order, grouped (`_prefill_groups`). Budgeted: at most
        prefill_tokens_per_step padded tokens this step; a group that does not fit goes on with its first row only, in
        chunks across steps, and the rows behind it wait, so rows complete in slot order."""
        outputs: list[StepOutput] = []
        budget = self.prefill_tokens_per_step
        for group in self._prefill_groups():
            if not budgeted:
                outputs += self._prefill(group, None)
                continue
            if budget <= 0:
                break
            width = max(len(s.prompt) - s.prefill_pos for s in group)
            cut = width * len(group) > budget and len(group) > 1
            if cut:
                group = group[:1]
                width = len(group[0].prompt) - group[0].prefill_pos
            outputs += self._prefill(group, budget)
            budget -= min(width, budget) * len(group)
            if cut or not group[0].prefilled:
                break
        return outputs

    def _prefill_groups(self) -> list[list[_Sequence]]:
        """Waiting sequences in runs of adjacent slots at the same prefill position (normally one run: new requests
        are appended at the end), each run cut where right-padding its prompts to one width would cost more than
        another forward."""
        runs: list[list[_Sequence]] = []
        for seq in self._running:
            if seq.prefilled:
                continue
            if runs and runs[-1][-1].slot == seq.slot - 1 and runs[-1][-1].prefill_pos == seq.prefill_pos:
                runs[-1].append(seq)
            else:
                runs.append([seq])
        return [run[a:b] for run in runs
                for a, b in split_padded_batch([len(s.prompt) - s.prefill_pos for s in run])]

    def _prefill(self, seqs: list[_Sequence], max_tokens: int | None) -> list[StepOutput]:
        """Prefill sequences of adjacent slots at one prefill position in one batch (right-padded, chunked), up to
        `max_tokens` positions further (None: to the end), and sample the first token of each one that completes.
        What a sequence needs across steps (its draft features, its prompt's logprobs) waits on the sequence."""
        device = self.target.device
        lengths = [len(s.prompt) for s in seqs]
        start, width = seqs[0].prefill_pos, max(lengths)
        end = width if max_tokens is None else min(width, start + max_tokens)
        prompts = torch.tensor([s.prompt + [0] * (width - len(s.prompt)) for s in seqs], dtype=torch.long,
                               device=device)
        last = torch.tensor(lengths, device=device) - 1
        view = self.cache.rows(seqs[0].slot, len(seqs))
        logits = torch.empty(len(seqs), self.target.vocab_size, device=device)
        #: rows that score their prompt need every position's logits; the others only their last one's
        scored = [row for row, s in enumerate(seqs) if s.params.prompt_logprobs is not None]
        for row in scored:
            if seqs[row].prompt_logprobs is None:
                seqs[row].prompt_logprobs = [None]  # nothing predicts the first prompt token
        for a in range(start, end, self.prefill_chunk_size):
            b = min(a + self.prefill_chunk_size, end)
            ends_here = (last >= a) & (last < b)
            at_last = (last - a).clamp(0, b - a - 1)
            wanted = "all" if scored else (at_last if bool(ends_here.any()) else "none")
            out = self.target.forward(prompts[:, a:b], torch.full((len(seqs),), a, device=device), view,
                                      feature_layers=self.feature_layers, logits=wanted, max_start=a)
            if out.logits is not None:
                chunk_logits = out.logits if not scored else out.logits.gather(
                    1, at_last[:, None, None].expand(-1, 1, out.logits.shape[2]))
                logits[ends_here] = chunk_logits[ends_here, 0]
            for row in scored:  # position p predicts prompt token p + 1
                stop = min(b, lengths[row] - 1)
                if stop > a:
                    seqs[row].prompt_logprobs += token_logprobs(out.logits[row, : stop - a],
                                                                prompts[row, a + 1 : stop + 1],
                                                                seqs[row].params.prompt_logprobs)
            if out.features is not None:
                for row, seq in enumerate(seqs):
                    seq.prefill_features.append(out.features[row : row + 1])
        outputs, forked = [], []
        for row, seq in enumerate(seqs):
            self.prompt_tokens_computed += max(0, min(end, lengths[row]) - seq.prefill_pos)
            seq.prefill_pos = seq.cache_len = min(end, lengths[row])
            if seq.prefill_pos == lengths[row]:
                features = torch.cat(seq.prefill_features, 1)[:, : lengths[row]] if seq.prefill_features else None
                seq.prefill_features = []
                if seq.request_id in self._forks:
                    forked.append((seq, logits[row : row + 1].clone(), features))
                outputs.append(self._finish_prefill(seq, logits[row : row + 1], features))
        for parent, parent_logits, features in forked:  # after the whole group: its rows are the prefilled prefix
            for fork in self._forks.pop(parent.request_id):
                self._place_fork(parent, fork)
                outputs.append(self._finish_prefill(fork, parent_logits.clone(), features))
        return outputs

    def _place_fork(self, parent: _Sequence, fork: _Sequence) -> None:
        """Give a fork the slot right after the prefilled rows (the waiting rows behind shift one slot, in order)
        and a copy of its parent's prompt KV: it is then prefilled too, with nothing computed."""
        at = self._num_decoding()
        self._running.append(fork)  # a placeholder at the end, overwritten by the shift
        for src in range(len(self._running) - 2, at - 1, -1):
            self._move(src, src + 1)
        self._running[at], fork.slot = fork, at
        self.batch_state.admit(at, fork.sequence_id, fork.params)
        n = len(parent.prompt)
        self.cache.move_slot(parent.slot, fork.slot, n)
        fork.prefill_pos = fork.cache_len = n
        if parent.prompt_logprobs is not None and fork.params.prompt_logprobs is not None:
            fork.prompt_logprobs = list(parent.prompt_logprobs)

    def _finish_prefill(self, seq: _Sequence, logits: torch.Tensor, feats: torch.Tensor | None) -> StepOutput:
        """The prompt is in the cache: sample its first token from the last position's logits [1, V], give the
        drafter the prompt and its features [1, n, F] (None without), and commit."""
        if seq.grammar is not None:
            mask_logits_(logits, seq.grammar.root_mask())
        first = self._first_token(seq, logits[0])
        first_logprobs = None
        if seq.params.logprobs is not None:
            first_logprobs = token_logprobs(scored_logits(logits, [seq.params]), torch.tensor([first]),
                                            seq.params.logprobs)
        seq.prefilled, seq.pending = True, first
        self.batch_state.append(seq.slot, seq.prompt + [first])
        if self._kv_drafter is not None:
            self._kv_drafter.start(seq.slot, seq.prompt + [first], feats)
        if seq.params.max_tokens == 0:  # prompt scoring only: nothing is generated
            seq.finish_reason = "length"
        out = self._commit(seq, [first] if seq.params.max_tokens else [], first_logprobs)
        if seq.prompt_logprobs is not None:
            out.prompt_logprobs = seq.prompt_logprobs
        return out

    def _first_token(self, seq: _Sequence, logits: torch.Tensor) -> int:
        p = seq.params
        if p.greedy:
            return int(logits.argmax())
        return int(sample_next(logits[None], RowSampling.draw([p], [seq.generator], logits.device))[0])

    def _draft_caps(self) -> list[int]:
        """Per row, how many drafts are worth verifying: within the row's budget and the step's token budget."""
        per_row_budget = max(0, self.max_verify_tokens // max(len(self._batch), 1) - 1)
        return [
            max(0, min(self.num_speculative_tokens, per_row_budget, _request_cap(s.params),
                       s.params.max_tokens - len(s.output) - 1,
                       self.max_seq_len - s.cache_len - 1))
            for s in self._batch
        ]

    def _draft_sampling(self) -> DraftSampling:
        """The round's draft sampling. Every sampled row reseeds its draft generators from one draw of its own
        generator, whether or not the round drafts: what a row draws never depends on its co-runners."""
        for seq in self._batch:
            if not seq.params.greedy:
                seed = fresh_seed(seq.generator)
                seq.draft_generator.manual_seed(seed)
                if seq.draft_device_generator is not seq.draft_generator:
                    seq.draft_device_generator.manual_seed(seed)
        return DraftSampling(self.batch_state.host_temperature(len(self._batch)),
                             [s.draft_generator for s in self._batch],
                             [s.draft_device_generator for s in self._batch])

    def _decode_round(self) -> list[StepOutput]:
        self._round_survival = {}  # the batch and its records as this round finds them (_observed_survival)
        seqs = self._batch
        B = len(seqs)
        device = self.target.device
        slots = list(range(B))
        pending = torch.tensor([[s.pending] for s in seqs], dtype=torch.long)
        caps = self._draft_caps()
        draft_tokens = torch.zeros(B, 0, dtype=torch.long)
        num_drafts = torch.zeros(B, dtype=torch.long)
        draft_probs = None
        proposal = None
        with self._phase("draft"):
            sampling = self._draft_sampling() if self.drafter is not None else None
            width = self._draft_width(caps) if sampling is not None and max(caps) > 0 else 0
            if width:
                self._flush_unheard(slots)
                # ragged from the drafter; padded once here to the round's width, for the batched ops
                proposal = self.drafter.propose(self.batch_state.view, slots, width, sampling).padded(width)
                if proposal.is_tree and not self.tree_attention:
                    proposal = first_children(proposal)
        if proposal is not None and proposal.is_tree:
            return self._tree_round(proposal, caps, pending)
        if proposal is not None:
            with self._phase("budget"):
                counts = [min(n, cap) for n, cap in zip(proposal.num_tokens.tolist(), caps)]
                if self.step_time is not None:
                    depth = self._budget_depth(proposal, counts)
                    counts = [min(n, depth) for n in counts]
                num_drafts = torch.tensor(counts, dtype=torch.long)
                k = max(counts)
                draft_tokens = proposal.tokens[:, :k]  # on the drafter's device: read back with the round's result
                draft_probs = proposal.probs[:, :k] if proposal.probs is not None and k else None
        with self._phase("grammar"):
            masks = self._grammar_walks(draft_tokens, num_drafts, None)
        if masks:  # a draft the grammar forbids ends its chain: its kept drafts are a prefix
            for row, (kept, _) in masks.items():
                num_drafts[row] = kept.index(False) if False in kept else len(kept)
            k = int(num_drafts.max()) if B else 0
            draft_tokens = draft_tokens[:, :k]
            draft_probs = draft_probs[:, :k] if draft_probs is not None and k else None
        k = draft_tokens.shape[1]
        inputs = torch.cat([pending.to(device), draft_tokens.to(device)], dim=1)
        start = torch.tensor([s.cache_len for s in seqs], dtype=torch.long, device=device)
        with self._phase("target"):
            out = self.target.forward(inputs, start, self.cache.rows(0, B), feature_layers=self.feature_layers,
                                      logits="all", max_start=max(s.cache_len for s in seqs))
        logits = out.logits  # [B, k+1, V]
        if masks:  # position j of a chain is scored in the state after its first j drafts: mask row j
            draft_probs = draft_probs.clone() if draft_probs is not None else None
            for row, (_, bitmask) in masks.items():
                n = int(num_drafts[row])
                mask_logits_(logits[row, : n + 1], bitmask[: n + 1])
                if draft_probs is not None and n:
                    draft_probs[row, :n] = restrict_draft_probs(draft_probs[row, :n], bitmask[:n])

        # every row in one batched op (torch.ops.deepspec.*): greedy rows get exactly the target's argmax
        with self._phase("verify"):
            sampling = self._row_sampling()
            # the round's one device-to-host read: how many drafts each row accepted, its next token, its drafts
            result = verify_result(draft_tokens, num_drafts, logits, draft_probs, sampling)
        accepted = [r[0] for r in result]
        committed = [r[2 : 2 + r[0]] + [r[1]] for r in result]
        num_list = num_drafts.tolist()
        with self._phase("logprobs"):
            logprobs = self._emitted_logprobs(logits, [list(range(len(c))) for c in committed], committed)
        return self._finish_round(committed, accepted, num_list, [None] * B, out.features, logprobs)

    def _row_sampling(self) -> RowSampling | None:
        """The verify step's per-row sampling: the batch state's parameter tensors (already on the target's
        device) and one fresh seed per row from its request's generator; None when every row is greedy."""
        seqs = self._batch
        if all(s.params.greedy for s in seqs):
            return None
        seeds = [fresh_seed(s.generator) for s in seqs]
        return RowSampling(*self.batch_state.sampling_params(len(seqs)),
                           torch.tensor(seeds, dtype=torch.int64, device=self.target.device))

    def _draft_width(self, caps: list[int]) -> int:
        """How many drafts per row this round asks the drafter for (0 = the round does not draft).

        A drafter that runs a model of its own for some rows (`Drafter.costly_rows`) is priced before it runs:
        the width is the depth the verification budget pays for on the rows' acceptance records
        (verify_budget.observed_survival) with the drafter's probed round time (propose and commit) for those rows
        added (`draft_time`), so a draft whose forward costs more than its accepted tokens win is not run at all and a
        neural chain drafts only as deep as pays (a tree drafter gets its whole node budget when drafting pays,
        its nodes then kept by `_budget_tree`). A drafter that costs next to nothing proposes the whole width and
        the budget cuts its drafts on their own estimates; a chain drafter is skipped where no depth pays on the
        rows' records (the budget caps estimates by them at several rows: at 8 rows of a few hundred positions,
        proposing for every row cost ~1 ms a round that the budget then threw away), a tree drafter where none would
        pay even if every node were accepted (its nodes are kept on their own estimates)."""
        width = max(caps)
        if self.step_time is None:
            return width
        costly = self.drafter.costly_rows(self.batch_state.view, list(range(len(caps)))) if self.draft_time else 0
        tree = getattr(self.drafter, "tree", None)
        if not costly and tree:
            return width if best_depth([[1.0] * width] * len(caps), self._round_model()) > 0 else 0
        survival = _live(self._observed_survival(width), caps)
        if not costly:
            return width if best_depth(survival, self._round_model()) > 0 else 0
        depth = best_depth(survival, self._round_model(),
                           self.draft_time.round_seconds(costly, torch.arange(width + 1)))
        return width if depth and tree else depth

    def _round_model(self):
        """The step-time model for this round's batch: its rows' context added (StepTimeModel.at_context)."""
        return self.step_time.at_context(sum(s.cache_len for s in self._batch))

    def _budget_depth(self, proposal: PaddedProposal, counts: list[int]) -> int:
        """The chain depth the verification budget pays for (verify_budget.best_depth), on the proposal's own
        survival estimates or, where it has none, on each sequence's acceptance record.

        A greedy row's estimates are scaled by how far they have held for it (verify_budget.EstimateCalibration),
        and in a batch of several rows also capped by its record. A drafter's estimates for deterministic drafts
        (no q: corpus lookup's tables) are measured on greedy replays; a sampled row accepts such a draft only with
        the target's probability of it, far less often, so a sampled row's estimate is capped by its own record:
        once drafting stops paying for it, it stops drafting (at 8 streams and temperature 1 the corpus draft was
        0.86x target-only before)."""
        width = proposal.tokens.shape[1]
        sampled = [not s.params.greedy for s in self._batch]
        # plain Python floats over [B][width] (verify_budget._throughputs says why)
        estimates = None if proposal.survival is None else _live(proposal.survival.tolist(), counts)
        if estimates is None:
            survival = _live(self._observed_survival(width), counts)
        else:  # greedy rows: the estimates as far as they held so far; sampled rows: capped by their records (0 past
            # a row's count stays 0: scaled, or the smaller of it and a record)
            all_greedy = not any(sampled)
            survival = [[min(v * factor, 1.0) for v in row] for row, factor in
                        zip(estimates, (s.calibration.factor(all_greedy) for s in self._batch))]
            if proposal.probs is None and (len(self._batch) > 1 or any(sampled)):
                # several rows: every row capped by its record too. One row verifies a few extra tokens at next to
                # no cost, so its good rounds may draft deep on the estimates; at 8 rows an extra verify token
                # costs ~6% of a pass, and trusting even calibrated estimates drafted rounds that lost (0.86x
                # --draft none at 8 rows of one prompt)
                survival = [[min(e if is_sampled else v, o) for e, v, o in zip(estimated, calibrated, observed)]
                            for estimated, calibrated, observed, is_sampled in
                            zip(estimates, survival, self._observed_survival(width), sampled)]
        if self._verify_overhead is None:  # a step-time model set by hand, without the engine's probes
            depth = best_depth(survival, self._round_model())
        else:  # a target-only round pays the op's short path, which the step curve's rounds all share
            extra = [0.0] + [self._verify_overhead[any(sampled)]] * width
            depth = best_depth(survival, self._round_model(), extra)
        if estimates is not None and depth:
            for seq, row in zip(self._batch, estimates):
                if seq.params.greedy:
                    seq.calibration.expect(sum(row[:depth]))
        return depth

    def _tree_round(self, proposal: PaddedProposal, caps: list[int], pending: torch.Tensor) -> list[StepOutput]:
        """One round over a token tree: the budget keeps each row's likeliest nodes, the target scores root +
        nodes with tree attention, tree_accept picks each row's accepted path and compact_kv moves its KV entries
        next to the committed prefix."""
        seqs = self._batch
        B = len(seqs)
        device = self.target.device
        with self._phase("budget"):
            num = torch.minimum(proposal.num_tokens.cpu(), torch.tensor(caps))
            parents = proposal.parents.cpu().long()
            try:
                check_parents(with_root(parents, num))
            except ValueError as exc:
                raise ValueError(f"drafter '{self.drafter.name}' proposed a malformed tree: {exc}") from None
            survival = proposal.survival.cpu() if proposal.survival is not None else None
            proposal = PaddedProposal(proposal.tokens.cpu(), num, proposal.probs, survival, parents)
            if self.step_time is not None:
                proposal = self._budget_tree(proposal)
        with self._phase("grammar"):
            proposal, masks = self._grammar_cut_tree(proposal)
        num = proposal.num_tokens
        k = int(num.max())
        tree_parents = with_root(proposal.parents[:, :k], num)  # [B, 1+k]
        inputs = torch.cat([pending, proposal.tokens[:, :k]], dim=1)
        start = torch.tensor([s.cache_len for s in seqs], dtype=torch.long, device=device)
        with self._phase("target"):
            out = self.target.forward(inputs.to(device), start, self.cache.rows(0, B),
                                      feature_layers=self.feature_layers, logits="all",
                                      max_start=max(s.cache_len for s in seqs),
                                      tree_parents=tree_parents if k else None)  # host parents: checked free
        sampling = self._row_sampling()
        q = None
        if proposal.probs is not None and k:
            probs = proposal.probs[:, :k].to(out.logits.device)
            q = torch.cat([probs.new_zeros(B, 1, probs.shape[2]), probs], dim=1)
        for row, (_, bitmask) in masks.items():  # column c is scored after node c; a node is drawn after its parent
            n = int(num[row])
            mask_logits_(out.logits[row, : n + 1], bitmask)
            if q is not None and n:
                q[row, 1 : n + 1] = restrict_draft_probs(q[row, 1 : n + 1], bitmask[tree_parents[row, 1 : n + 1]])
        with self._phase("verify"):
            num_accepted, next_token, path = verify_tree(inputs, tree_parents, num + 1, out.logits, q, sampling)
            # the round's one read of its result: accepted count, next token and accepted path per row
            result = torch.cat([num_accepted[:, None], next_token[:, None], path], dim=1).tolist()
            accepted, next_tokens, paths = [r[0] for r in result], [r[1] for r in result], [r[2:] for r in result]
        with self._phase("kv"):
            self.cache.keep_path(start, path, num_accepted)
        rows = inputs.tolist()
        committed = [[rows[i][node] for node in paths[i][1 : accepted[i] + 1]] + [next_tokens[i]] for i in range(B)]
        # committed token j was predicted at the path's node j (the root, then each accepted node)
        with self._phase("logprobs"):
            logprobs = self._emitted_logprobs(out.logits, [paths[i][: accepted[i] + 1] for i in range(B)],
                                              committed)  # fmt: skip
        depth = node_depths(proposal.parents[:, :k], num) if k else torch.zeros(B, 0, dtype=torch.long)
        live = torch.arange(k)[None, :] < num[:, None]
        max_depth = torch.where(live, depth, torch.zeros_like(depth)).amax(1).tolist() if k else [0] * B
        features = out.features
        if features is not None:  # features[b, j] = the feature at the node before committed token j
            features = features.gather(1, path.clamp(min=0)[:, :, None].expand(-1, -1, features.shape[2]))
        return self._finish_round(committed, accepted, num.tolist(), max_depth, features, logprobs)

    def forget_acceptance(self) -> None:
        """Start the acceptance prior afresh: after a warm-up request, which is not traffic (a few tokens of a
        throwaway prompt), so what it accepted must not decide whether the next sequences draft."""
        self.acceptance_history = AcceptanceHistory()

    def _observed_survival(self, width: int) -> list[list[float]]:
        """[B][width] survival from the batch's own acceptance records, each shrunk toward the prior the engine's
        finished greedy sequences give (sampled rows: the fixed prior; verify_budget.AcceptanceHistory). In a batch
        with a sampled row every row takes the fixed prior: the round's depth is the batch's, so a greedy co-runner's
        history-fed estimate would change which depths the sampled row drafts, and with them its draws (a seeded
        request replays on the same batch, whatever the engine served before). Computed once a round per width:
        the records change only when the round commits (`_round_survival`, emptied as each round starts)."""
        if width not in self._round_survival:
            records = [(s.stats.proposed_per_position, s.stats.accepted_per_position) for s in self._batch]
            all_greedy = all(s.params.greedy for s in self._batch)
            prior = [self.acceptance_history.prior(s.params.greedy and all_greedy, width, s.sequence_id,
                                                   sampled=not s.params.greedy) for s in self._batch]
            self._round_survival[width] = observed_survival(records, width, prior)
        return self._round_survival[width]

    def _budget_tree(self, proposal: PaddedProposal) -> PaddedProposal:
        """Keep each row's top-w nodes by survival, w the width whose B * (w + 1) verify tokens the step-time
        model says pay best (verify_budget.best_nodes). A tree over budget is cut, never refused: the kept nodes
        are ancestor-closed because survival is made non-increasing along paths first."""
        parents, num = proposal.parents, proposal.num_tokens
        k = proposal.tokens.shape[1]
        survival = proposal.survival
        if survival is None:
            survival = tree_survival_from_record(torch.tensor(self._observed_survival(max(k, 1)), dtype=torch.float64)
                                                 .reshape(len(self._batch), max(k, 1)), parents, num)
        keep = best_nodes(monotone_survival(survival, parents, num), self._round_model())
        return keep_nodes(proposal, keep & (torch.arange(k)[None, :] < num[:, None]))

    def _grammar_cut_tree(self, proposal: PaddedProposal) -> tuple[PaddedProposal, dict]:
        """A tree with the nodes its row's grammar forbids cut, with their subtrees, and the walks of what stays."""
        masks = self._grammar_walks(proposal.tokens, proposal.num_tokens, proposal.parents)
        if any(not all(kept) for kept, _ in masks.values()):
            keep = torch.arange(proposal.tokens.shape[1])[None, :] < proposal.num_tokens[:, None]
            for row, (kept, _) in masks.items():
                keep[row, : len(kept)] = torch.tensor(kept, dtype=torch.bool)
            proposal = keep_nodes(proposal, keep)
            masks = self._grammar_walks(proposal.tokens, proposal.num_tokens, proposal.parents)
        return proposal, masks

    def _grammar_walks(self, tokens: torch.Tensor, num: torch.Tensor,
                       parents: torch.Tensor | None) -> dict[int, tuple[list[bool], torch.Tensor]]:
        """Per constrained row, its proposal (tokens [B, k] CPU, num [B], parents [B, k] or None for chains) walked
        through its grammar (structured.RowGrammar.walk): which nodes the grammar allows, and the bitmask of allowed
        tokens at the root and after each node. Unconstrained rows are absent: they cost nothing."""
        walks = {}
        if all(seq.grammar is None for seq in self._batch):
            return walks
        tokens = tokens.cpu()  # walking a grammar is host work: one read of the drafts, constrained rounds only
        for row, seq in enumerate(self._batch):
            if seq.grammar is None:
                continue
            n = int(num[row])
            row_parents = parents[row, :n].tolist() if parents is not None else list(range(-1, n - 1))
            walks[row] = seq.grammar.walk(tokens[row, :n].tolist(), row_parents)
        return walks

    def _emitted_logprobs(self, logits: torch.Tensor, positions: list[list[int]],
                          committed: list[list[int]]) -> list[list[TokenLogprob] | None]:
        """Per row that asked for logprobs, its committed tokens' logprobs from the verify logits [B, T, V] at
        `positions` (the position that predicted each committed token); None for the other rows, at no cost."""
        rows = [i for i, s in enumerate(self._batch) if s.params.logprobs is not None]
        result: list[list[TokenLogprob] | None] = [None] * len(committed)
        if not rows:
            return result
        row_index = torch.tensor([i for i in rows for _ in positions[i]], device=logits.device)
        pos_index = torch.tensor([p for i in rows for p in positions[i]], device=logits.device)
        tokens = torch.tensor([t for i in rows for t in committed[i]])
        num_top = max(self._batch[i].params.logprobs for i in rows)
        flat = token_logprobs(scored_logits(logits[row_index, pos_index],
                                            [self._batch[i].params for i in rows for _ in positions[i]]),
                              tokens, num_top)
        at = 0
        for i in rows:
            n, keep = len(committed[i]), self._batch[i].params.logprobs
            result[i] = [TokenLogprob(lp.token_id, lp.logprob, lp.top_token_ids[:keep], lp.top_logprobs[:keep])
                         for lp in flat[at : at + n]]
            at += n
        return result

    def _finish_round(self, committed: list[list[int]], accepted: list[int], num_drafts: list[int],
                      depths: list[int | None], features: torch.Tensor | None,
                      logprobs: list[list[TokenLogprob] | None]) -> list[StepOutput]:
        """Commit each row's accepted drafts + next token (and their logprobs, where asked), record the round, and
        tell the drafter; features [B, >= len(committed[b]), F] are aligned with the committed tokens (the feature
        before each one)."""
        results, extend_rows, committed_rows = [], [], []
        with self._phase("commit"):
            for i, seq in enumerate(self._batch):
                n = accepted[i]
                seq.cache_len += 1 + n
                seq.pending = committed[i][-1]
                seq.stats.record(num_drafts[i], n, depths[i])
                seq.calibration.settle(n)
                out_i = self._commit(seq, committed[i], logprobs[i])
                out_i.num_draft_tokens, out_i.num_accepted_tokens = num_drafts[i], n
                out_i.num_verify_tokens = 1 + num_drafts[i]
                results.append(out_i)
                if not seq.finish_reason:
                    self.batch_state.append(i, committed[i])
                    extend_rows.append(i)
                    committed_rows.append(committed[i])
        with self._phase("draft_update"):
            self._tell_drafter(extend_rows, committed_rows, features)
        return results

    def _tell_drafter(self, extend_rows: list[int], committed_rows: list[list[int]],
                      features: torch.Tensor | None) -> None:
        """A drafter with state of its own is to hear each still-running row's committed tokens and the features
        before each one (the others read them from the batch state). They wait on the sequence until the drafter
        next proposes (`_flush_unheard`): a round that does not draft costs the drafter nothing, and a sequence the
        budget has stopped drafting for decodes at the target's own pace. Past MAX_UNHEARD_TOKENS a row is told
        at once, so what waits stays small."""
        if self._kv_drafter is None or not extend_rows:
            return
        for i, row in enumerate(extend_rows):
            seq = self._batch[row]
            seq.unheard.append((committed_rows[i], None if features is None else
                                features[row, : len(committed_rows[i])].clone()))  # fmt: skip
        self._flush_unheard([row for row in extend_rows
                             if sum(len(chunk) for chunk, _ in self._batch[row].unheard) > MAX_UNHEARD_TOKENS])

    def _flush_unheard(self, rows: list[int]) -> None:
        """The KV drafter hears what these rows committed since it last heard them, in one call."""
        rows = [row for row in rows if self._batch[row].unheard]
        if not rows:
            return
        tokens = [sum((chunk for chunk, _ in self._batch[row].unheard), []) for row in rows]
        features = None
        if self._batch[rows[0]].unheard[0][1] is not None:
            parts = [torch.cat([f for _, f in self._batch[row].unheard]) for row in rows]
            features = torch.nn.utils.rnn.pad_sequence(parts, batch_first=True)
        for row in rows:
            self._batch[row].unheard = []
        self._kv_drafter.commit_rows(rows, tokens, features)

    @property
    def _rows_serial(self) -> bool:
        """Whether the target runs a multi-token pass over several rows one row at a time (OnnxTarget)."""
        return bool(getattr(self.target, "multi_token_rows_serial", False))

    def _recorded_step_time(self) -> StepTimeModel | None:
        """The target's own recorded verify-step curve on this machine (an ONNX export times it once; see
        deepspec/models/step_curve.py), or None."""
        recorded = getattr(self.target, "recorded_step_curve", lambda: None)()
        return StepTimeModel(sorted(recorded.items()), self._rows_serial) if recorded else None

    def _probe_step_time(self) -> StepTimeModel:
        """Time verify-shaped passes of 1 .. max_verify_tokens tokens on slot 0 while no request runs yet (what
        they write there is overwritten by the first prefill); the fastest of two runs per size. Measured once per
        target, sizes and captured layers in a process: an eval or a test suite builds many engines on one target."""
        sizes = tuple(sorted({n for n in (1, 2, 4, 8, 16, 32, self.max_verify_tokens)
                              if n <= min(self.max_verify_tokens, self.max_seq_len - 1)} | {1, 2}))
        measured = _STEP_TIME_MODELS.setdefault(self.target, {})
        key = (sizes, self.feature_layers)
        if key not in measured:
            measured[key] = self._time_verify_passes(sizes)
        return measured[key]

    def _probe_verify_overhead(self) -> dict[bool, float]:
        """What the acceptance op adds to a round that verifies drafts, against a target-only round, greedy and
        sampled: the op over num_speculative_tokens random drafts (rejected at their first slot, as most drafts are
        where drafting is in doubt) less the op over none, on logits of the target's vocabulary; the fastest of five
        runs each, with the step's torch threads. Why: at temperature 1 the sampled op's general path costs ~0.6 ms
        a round at batch 1 more than its target-only path, 5% of an ONNX decode step, which the step curve does not
        hold; a corpus draft accepted 17% of the time at temperature 1 (τ 1.2) served 0.89-1.01x target-only.
        Measured once per target and width in a process."""
        measured = _VERIFY_OVERHEADS.setdefault(self.target, {})
        k = self.num_speculative_tokens
        if k not in measured:
            with _torch_threads(self._host_threads):
                measured[k] = _time_verify_overhead(self.target.vocab_size, k, self.target.device)
        return measured[k]

    def _probe_draft_time(self) -> DraftTimeModel:
        """Time what a drafted round costs the drafter (draft_time.probe_draft_time) while no request runs yet,
        over one to all slots at widths 1 and num_speculative_tokens."""
        return probe_draft_time(self.target, self.drafter, tuple(sorted({1, self.max_batch_size})),
                                tuple(sorted({1, self.num_speculative_tokens})), self.max_seq_len)

    def _time_verify_passes(self, sizes: tuple[int, ...]) -> StepTimeModel:
        with torch.inference_mode():
            self._timed_pass(sizes[-1])  # one-time kernel setup stays out of the timings
            samples = {n: min(self._timed_pass(n), self._timed_pass(n)) for n in sizes}
            return StepTimeModel(sorted(samples.items()), self._rows_serial, self._attention_per_key_query(samples))

    def _attention_per_key_query(self, after_nothing: dict[int, float]) -> float:
        """Seconds of attention per (verified token, context key): a pass of n tokens after CONTEXT_PROBE positions
        against the same pass after none (StepTimeModel.at_context). 0 on a target whose rows run serially (its
        recorded curve is timed after a context already) or a cache too short to tell."""
        n = max(k for k in after_nothing if k <= 8)
        context = min(CONTEXT_PROBE, self.max_seq_len - n - 1)
        if context < 64 or self._rows_serial:
            return 0.0
        after = min(self._timed_pass(n, context), self._timed_pass(n, context))
        return max(0.0, (after - after_nothing[n]) / (n * context))

    def _timed_pass(self, n: int, start: int = 0) -> float:
        """Seconds of one verify-shaped pass of n tokens at position `start` of slot 0 (its writes are overwritten
        by the first prefill)."""
        device = self.target.device
        tokens = torch.zeros(1, n, dtype=torch.long, device=device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        self.target.forward(tokens, torch.full((1,), start, dtype=torch.long, device=device), self.cache.rows(0, 1),
                            feature_layers=self.feature_layers, logits="all", max_start=start)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    # ---- bookkeeping -------------------------------------------------------------------------------------------
    def _commit(self, seq: _Sequence, tokens: list[int],
                logprobs: list[TokenLogprob] | None = None) -> StepOutput:
        """Append committed tokens (and their logprobs, aligned) up to the first stop condition; return what to
        stream."""
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
        if not seq.finish_reason and seq.cache_len + 1 >= self.max_seq_len:
            seq.finish_reason = "length"
        if seq.finish_reason and stop_at is None:
            text += seq.detokenizer.flush()
        kept_logprobs = stop_logprob = None
        if seq.logprobs is not None:
            kept_logprobs = list(logprobs or [])[: len(kept)]
            seq.logprobs.extend(kept_logprobs)
            if stop_index is not None and stop_index == len(kept) and len(logprobs or ()) > stop_index:
                stop_logprob = logprobs[stop_index]  # the stop token right after what is kept
        return StepOutput(seq.request_id, kept, text, seq.finish_reason is not None, seq.finish_reason,
                          logprobs=kept_logprobs, stop_logprob=stop_logprob)

    def _release(self, finished: list[_Sequence]) -> None:
        """Free finished sequences' slots, keeping the running ones in slots 0..n-1 with every prefilled row before
        every waiting one: a hole among the prefilled rows takes the last prefilled row, and that row's slot the
        last waiting one."""
        for seq in sorted(finished, key=lambda s: s.slot, reverse=True):
            self.acceptance_history.add(seq.params.greedy, seq.stats.proposed_per_position,
                                        seq.stats.accepted_per_position, seq.calibration)
            if self._kv_drafter is not None and seq.prefilled:
                self._kv_drafter.release(seq.slot)
            hole = seq.slot
            self.batch_state.clear(hole)
            last_prefilled = self._num_decoding() - 1
            if seq.prefilled and hole != last_prefilled:
                self._move(last_prefilled, hole)
                hole = last_prefilled
            if hole != len(self._running) - 1:
                self._move(len(self._running) - 1, hole)
            self._running.pop()
            self._forget(seq)
            for fork in self._forks.pop(seq.request_id, []):  # an aborted parent: its forks prefill on their own
                fork.slot = len(self._running)
                self._running.append(fork)
                self.batch_state.admit(fork.slot, fork.sequence_id, fork.params)

    def _forget(self, seq: _Sequence) -> None:
        del self._by_id[seq.request_id]
        if seq.keep_result:
            self._finished[seq.request_id] = seq

    def _move(self, src: int, dst: int) -> None:
        """The sequence in slot src moves to the free slot dst: its KV entries, its batch state, its drafter
        state, its index."""
        moved = self._running[src]
        self.cache.move_slot(src, dst, moved.cache_len)
        self.batch_state.move(src, dst)
        if self._kv_drafter is not None and moved.prefilled:
            self._kv_drafter.move_slot(src, dst)
        moved.slot = dst
        self._running[dst] = moved

    # ---- convenience -------------------------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams],
                 on_output=None) -> list[GenerationResult]:
        """Run prompts to completion with continuous batching; `on_output(StepOutput)` streams each chunk."""
        all_params = params if isinstance(params, list) else [params] * len(prompts)
        ids = [f"gen-{next(_ids)}" for _ in prompts]
        for prompt, p in zip(prompts, all_params):
            self.validate(prompt, p)
        queue = list(zip(ids, prompts, all_params))
        while queue or self._running:
            while queue and self.num_free_slots:
                self.add_request(*queue.pop(0), keep_result=True)
            for out in self.step():
                if on_output is not None:
                    on_output(out)
        return [self.pop_result(i) for i in ids]

    def pop_result(self, request_id: str) -> GenerationResult:
        """The finished request's full record (tokens, text, acceptance statistics)."""
        seq = self._finished.pop(request_id)
        return GenerationResult(request_id=request_id, prompt_token_ids=seq.prompt, token_ids=seq.output,
                                text=seq.detokenizer.text, finish_reason=seq.finish_reason,
                                logprobs=seq.logprobs, prompt_logprobs=seq.prompt_logprobs, **vars(seq.stats))


_ids = itertools.count()
#: committed tokens a sequence may hold back from its KV drafter before it is told anyway (_tell_drafter)
MAX_UNHEARD_TOKENS = 256
#: target -> {(verify sizes, captured layers): its verify-pass cost model}; dropped with the target
_STEP_TIME_MODELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: context positions the attention probe passes after (_attention_per_key_query)
CONTEXT_PROBE = 256
#: target -> {draft width: _probe_verify_overhead's seconds by sampling mode}; dropped with the target
_VERIFY_OVERHEADS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: target → its GrammarCompiler (the compiled vocabulary and grammars), shared by the engines built on it
_GRAMMAR_COMPILERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

#: what one more prefill forward costs, in padded tokens: its fixed part (reading every weight once, ~40 ms for the
#: default target in fp32 on one CPU core) against ~6 ms per prompt token. On a GPU the fixed part weighs more and a
#: padded token less, so this bound cuts more often than the optimum there: at worst one more small forward per cut.
PREFILL_FORWARD_COST_TOKENS = 32


def split_padded_batch(lengths: list[int], forward_cost: int = PREFILL_FORWARD_COST_TOKENS) -> list[tuple[int, int]]:
    """Cut prompts of adjacent slots into contiguous runs `[a, b)` minimising Σ forward_cost + (b - a) × the run's
    longest prompt: one batch of a 449-token and nineteen 100-token prompts pads 20 × 449 tokens, two batches
    449 + 19 × 100. Exact, by dynamic programming over at most max_batch_size rows."""
    best, cut = [0.0] + [float("inf")] * len(lengths), [0] * (len(lengths) + 1)  # best[j]: the first j prompts
    for j in range(1, len(lengths) + 1):
        width = 0
        for i in range(j - 1, -1, -1):  # the last run is [i, j)
            width = max(width, lengths[i])
            if best[i] + forward_cost + width * (j - i) < best[j]:
                best[j], cut[j] = best[i] + forward_cost + width * (j - i), i
    runs, j = [], len(lengths)
    while j:
        runs.append((cut[j], j))
        j = cut[j]
    return runs[::-1]


def _live(rows: list[list[float]], counts: list[int]) -> list[list[float]]:
    """[B][width] per-slot values with each row's slots past its count set to 0 (no draft, nothing to survive)."""
    return [[v if j < n else 0.0 for j, v in enumerate(row)] for row, n in zip(rows, counts)]


def _request_cap(params: SamplingParams) -> int:
    """The draft tokens a request allows a round (SamplingParams.max_draft_tokens; no limit when it leaves it unset)."""
    return params.max_draft_tokens if params.max_draft_tokens is not None else 1 << 30


def _merge(into: StepOutput, more: StepOutput) -> None:
    into.new_token_ids.extend(more.new_token_ids)
    into.new_text += more.new_text
    into.finished, into.finish_reason = more.finished, more.finish_reason
    into.num_draft_tokens += more.num_draft_tokens
    into.num_accepted_tokens += more.num_accepted_tokens
    into.num_verify_tokens += more.num_verify_tokens
    if into.logprobs is not None and more.logprobs is not None:
        into.logprobs.extend(more.logprobs)
    into.stop_logprob = more.stop_logprob


@contextmanager
def _torch_threads(count: int | None):
    """torch's intra-op thread count set to `count` (this thread's; None: unchanged) for the block, then restored.

    Why: a target whose forward runs in a thread pool of its own (ONNX Runtime's, spinning within its run) shares
    the cores with torch's OpenMP workers, which the engine's own torch ops wake (a sampled row's softmax and
    cumsum over the vocabulary) and which then spin after each parallel region; spinning on the cores ONNX
    Runtime's threads need, they made its next forward ~40% slower (batch-1 sampled decode 55 against 78 tok/s
    with one torch thread, int8 graph, 2-core Zen 4). The engine's own ops on a few rows need no second thread."""
    if count is None or count == torch.get_num_threads():
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@torch.inference_mode()
def _time_verify_overhead(vocab: int, k: int, device: torch.device) -> dict[bool, float]:
    """{sampled: seconds the acceptance op costs over k drafts beyond over none} (_probe_verify_overhead), >= 0."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, k + 1, vocab, generator=g).to(device)
    drafts = torch.randint(vocab, (1, k), generator=g).to(device)
    sampled = RowSampling(torch.ones(1, device=device), torch.zeros(1, dtype=torch.long, device=device),
                          torch.ones(1, device=device), torch.zeros(1, dtype=torch.long, device=device))

    def fastest(width: int, sampling: RowSampling | None) -> float:
        runs = []
        for _ in range(6):  # the first run (imports, allocations) is dropped
            t0 = time.perf_counter()
            num_accepted, _ = verify(drafts[:, :width], torch.tensor([width]), logits[:, : width + 1], None, sampling)
            int(num_accepted[0])  # the result on the host, as the round reads it
            runs.append(time.perf_counter() - t0)
        return min(runs[1:])

    return {mode: max(0.0, fastest(k, sampling) - fastest(0, sampling))
            for mode, sampling in ((False, None), (True, sampled))}
