"""The speculative decoding engine: prefill → (propose → verify → accept → stream) until each request stops.

`SpecEngine.step()` is one scheduler iteration: new requests are prefilled (prefill.py), then every running row takes
one batched round (propose, verify in one forward, accept, commit). How deep a round verifies is the planner's call
(planner.py); the round, token trees, state, devices, forks and sessions are described in DESIGN.md beside this file.

Requests may join (`add_request`) and leave (finish, `abort`) between steps: continuous batching. The engine is
not thread-safe; a server drives it from one thread (only `validate` may be called from others). It decodes text only
through `target.decode`, to detokenize incrementally and to honour stop strings. Bad requests raise `RequestError`
with a typed code (deepspec/decoding/validation.py), checked here once for every server.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Sequence

import torch

from deepspec.decoding import step_timing
from deepspec.decoding.batch_state import BatchState, new_sequence_id
from deepspec.decoding.detokenizer import IncrementalDetokenizer
from deepspec.decoding.drafter import Drafter, DraftSampling, KVDrafter, PaddedProposal
from deepspec.decoding.grammar_walks import cut_chains, cut_tree, mask_chains, mask_trees, walk_rows
from deepspec.decoding.host_threads import torch_threads
from deepspec.decoding.logprobs import TokenLogprob, emitted_logprobs
from deepspec.decoding.params import GenerationResult, SamplingParams, StepOutput
from deepspec.decoding.phases import PhaseTimer, untimed
from deepspec.decoding.planner import EngineShape, RoundPlanner
from deepspec.decoding.prefill import PrefillRunner
from deepspec.decoding.sequence import SequenceState, fork_parent, take_unheard
from deepspec.decoding.session_memory import SessionMemory
from deepspec.decoding.structured import GrammarCompiler
from deepspec.decoding.tree import first_children, node_depths, with_root
from deepspec.decoding.validation import RequestError, RequestErrorCode, validate_request
from deepspec.decoding.verify import RowSampling, fresh_seed, verify_result, verify_tree
from deepspec.models.target import Target, TreeSlotCache
from deepspec.models.tree_attention import check_parents


class EngineFullError(RuntimeError):
    """Every slot is taken; retry after a request finishes (servers answer 429 / queue it)."""


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
        planner: RoundPlanner | None = None,
        session_memory: SessionMemory | None = None,
        seed: int = 0,
    ):
        if max_batch_size < 1 or num_speculative_tokens < 0 or max_seq_len < 2:
            raise ValueError("need max_batch_size >= 1, num_speculative_tokens >= 0 and max_seq_len >= 2")
        self.target = target
        self.drafter = drafter
        #: torch's intra-op threads while a step runs, where the target asks for its own count (OnnxTarget's forward
        #: runs in ONNX Runtime's pool, see host_threads.py); None = torch's
        self._host_threads: int | None = target.host_threads
        self.max_batch_size = max_batch_size
        self.max_seq_len = min(max_seq_len, target.max_seq_len)
        #: drafts verified per row and round at most: chain slots, or tree nodes (the cache slack below fits them)
        self.num_speculative_tokens = num_speculative_tokens if drafter is not None else 0
        #: tokens one verify pass may score across all rows; past it a batched forward stops being memory-bound on
        #: CPU and every extra draft slot costs real time, so large batches draft shorter blocks
        self.max_verify_tokens = max_verify_tokens
        #: prompt tokens a step may prefill while rows decode (chunked prefill across steps); by default a decode
        #: round's own verify tokens, so a long prompt arriving at most about doubles the running streams' step time
        self.prefill_tokens_per_step = prefill_tokens_per_step or max_verify_tokens
        self.feature_layers = tuple(drafter.feature_layers) if drafter is not None else ()
        #: token trees are verified in one pass with tree attention; otherwise as each tree's chain of first children
        self.tree_attention = target.supports_tree_attention
        #: the target scores each row's own number of tokens in a pass: the planner picks a depth per row
        self.ragged_rows = target.ragged_rows
        # slack past max_seq_len: padded draft slots of a row near its limit still have somewhere to go
        self.cache = target.new_cache(max_batch_size, self.max_seq_len + self.num_speculative_tokens + 1)
        #: the answers served to each session, for requests that name one (SamplingParams.session)
        self.session_memory = session_memory if session_memory is not None else SessionMemory()
        if drafter is not None:
            drafter.bind(target, max_batch_size, self.max_seq_len)
            drafter.use_session_memory(self.session_memory)
        #: every slot's committed tokens and sampling parameters, the one record drafters read (batch_state.py)
        self.batch_state = BatchState(max_batch_size, self.max_seq_len + self.num_speculative_tokens + 2, target.device)
        #: the drafter's commit and slot-move hooks, for drafters with state of their own (None = it reads the view)
        self._kv_drafter = drafter if isinstance(drafter, KVDrafter) else None
        #: runs each prefill group through the target and starts its sequences (prefill.py)
        self._prefill_runner = PrefillRunner(
            target,
            self.cache,
            self.batch_state,
            self._kv_drafter,
            chunk_size=prefill_chunk_size,
            feature_layers=self.feature_layers,
            max_seq_len=self.max_seq_len,
        )
        #: how deep each round verifies (deepspec/decoding/planner.py); by default what the drafter proposes
        self.planner = self._bind_planner(planner)
        self._rng = torch.Generator().manual_seed(seed)
        self._eos = frozenset(target.eos_token_ids)
        self._running: list[SequenceState] = []  # index == slot
        #: the rows of the decode round in progress: the prefilled prefix of _running
        self._batch: list[SequenceState] = []
        self._by_id: dict[str, SequenceState] = {}
        #: waiting request id -> the sequences forked from its prompt, placed in slots when its prefill completes
        self._forks: dict[str, list[SequenceState]] = {}
        self._finished: dict[str, SequenceState] = {}  # only requests added with keep_result=True
        #: the context each step phase runs in: untimed unless `profile` is on (deepspec/decoding/phases.py)
        self._phase = untimed

    def _bind_planner(self, planner: RoundPlanner | None) -> RoundPlanner:
        """The round planner (by default one that verifies what the drafter proposes), bound once to this engine."""
        planner = planner if planner is not None else RoundPlanner()
        planner.bind(
            EngineShape(
                self.target,
                self.drafter,
                self.max_batch_size,
                self.max_seq_len,
                self.num_speculative_tokens,
                self.max_verify_tokens,
                self.feature_layers,
                self.cache,
            )
        )
        return planner

    # ---- admission ---------------------------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        """Sequences holding a slot, forks waiting on their parent's prefill included."""
        return len(self._running) + sum(len(forks) for forks in self._forks.values())

    @property
    def prompt_tokens_computed(self) -> int:
        """Prompt tokens run through the target so far (forks share their parent's)."""
        return self._prefill_runner.tokens_computed

    @property
    def prefill_chunk_size(self) -> int:
        """The longest prefill forward, in prompt positions (the prefill runner's chunk)."""
        return self._prefill_runner.chunk_size

    @property
    def num_free_slots(self) -> int:
        return self.max_batch_size - self.num_running

    def has_unfinished(self) -> bool:
        return bool(self._running)

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise RequestError (a ValueError with a RequestErrorCode) unless the request fits this engine; called by
        add_request, and by servers before they queue a request. Reads only fixed settings: safe from any thread."""
        validate_request(
            prompt_token_ids, params.max_tokens, max_seq_len=self.max_seq_len, vocab_size=self.target.vocab_size
        )
        if params.structured is not None:
            self._grammar_compiler().check(params.structured)

    def _grammar_compiler(self) -> GrammarCompiler:
        """One per target in a process: compiling against a vocabulary costs seconds the first time."""
        if self.target not in _GRAMMAR_COMPILERS:
            _GRAMMAR_COMPILERS[self.target] = GrammarCompiler(self.target)
        return _GRAMMAR_COMPILERS[self.target]

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        keep_result: bool = False,
        fork_of: str | None = None,
    ) -> None:
        """Queue a request for the next step; keep_result=True keeps its record for `pop_result`. `fork_of` names a
        waiting request with the same prompt: this sequence then shares its prefill (the module docstring)."""
        if request_id in self._by_id:
            raise RequestError(RequestErrorCode.REQUEST_ID_IN_USE, f"request id '{request_id}' is already running")
        prompt, priority = list(prompt_token_ids), params.priority
        self.validate(prompt, params)
        if self.num_free_slots == 0:
            raise EngineFullError(f"all {self.max_batch_size} slots are busy")
        parent = fork_parent(self._by_id.get(fork_of), fork_of, prompt) if fork_of is not None else None
        seed = params.seed if params.seed is not None else fresh_seed(self._rng)
        stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self._eos)
        generator = torch.Generator().manual_seed(seed)
        device = self.target.device
        draft_generator = torch.Generator()
        seq = SequenceState(
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
        self.planner.admit(seq)
        if parent is not None:
            seq.slot = -1  # placed when the parent's prefill completes
            self._forks.setdefault(parent.request_id, []).append(seq)
        else:  # before the waiting prompts of a larger priority: prefill goes in slot order
            later = (i for i in range(self._num_decoding(), seq.slot) if self._running[i].params.priority > priority)
            self._insert(seq, next(later, seq.slot))
        self._by_id[request_id] = seq

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
        with self._phase("step"), torch_threads(self._host_threads):
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
            budget = self.prefill_tokens_per_step if self._num_decoding() > 0 else None
            for out in self._prefill_runner.step(self._running, budget, self._forks, self._place_forks):
                outputs[out.request_id] = out
        with self._phase("release"):
            self._release([s for s in self._running if s.finish_reason])
        decoding = self._num_decoding()
        if decoding:
            self._batch = self._running[:decoding]
            for out in self._decode_round():
                if out.request_id in outputs:
                    outputs[out.request_id].merge(out)
                else:
                    outputs[out.request_id] = out
            with self._phase("release"):
                self._release([s for s in self._running if s.finish_reason])
        return list(outputs.values())

    def _num_decoding(self) -> int:
        """How many rows have finished their prefill: always the first slots (prefill completes in slot order and
        `_release` keeps the prefilled rows in front), so a decode round reads its cache rows as one view."""
        return next((i for i, s in enumerate(self._running) if not s.prefilled), len(self._running))

    def _place_forks(self, parent: SequenceState) -> list[SequenceState]:
        """Give each fork of a parent whose prefill completed the slot right after the prefilled rows (the waiting
        rows behind shift one slot, in order) and a copy of its parent's prompt KV: it is then prefilled too, with
        nothing computed (the prefill runner starts it). → the forks, placed."""
        forks = self._forks.pop(parent.request_id)
        for fork in forks:
            self._insert(fork, self._num_decoding())
            n = len(parent.prompt)
            self.cache.move_slot(parent.slot, fork.slot, n)
            fork.prefill_pos = fork.cache_len = n
            if parent.prompt_logprobs is not None and fork.params.prompt_logprobs is not None:
                fork.prompt_logprobs = list(parent.prompt_logprobs)
        return forks

    def _insert(self, seq: SequenceState, at: int) -> None:
        """Give `seq` slot `at`; the rows from `at` on move one slot back, in order."""
        self._running.append(seq)  # a placeholder at the end, overwritten by the shift
        for src in range(len(self._running) - 2, at - 1, -1):
            self._move(src, src + 1)
        self._running[at], seq.slot = seq, at
        self.batch_state.admit(at, seq.sequence_id, seq.params)

    def _draft_caps(self) -> list[int]:
        """Per row, how many drafts are worth verifying: within the row's budget and the step's token budget."""
        per_row_budget = max(0, self.max_verify_tokens // max(len(self._batch), 1) - 1)
        return [
            max(
                0,
                min(
                    self.num_speculative_tokens,
                    per_row_budget,
                    _request_cap(s.params),
                    s.params.max_tokens - len(s.output) - 1,
                    self.max_seq_len - s.cache_len - 1,
                ),
            )
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
        return DraftSampling(
            self.batch_state.host_temperature(len(self._batch)),
            [s.draft_generator for s in self._batch],
            [s.draft_device_generator for s in self._batch],
        )

    def _decode_round(self) -> list[StepOutput]:
        seqs = self._batch
        self.planner.start_round(seqs)
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
            width = (
                self.planner.draft_width(seqs, caps, self.batch_state.view)
                if sampling is not None and max(caps) > 0
                else 0
            )
            if width:
                assert self.drafter is not None and sampling is not None  # a width needs draft sampling
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
                if self.ragged_rows:
                    counts = [min(n, d) for n, d in zip(counts, self.planner.row_depths(seqs, proposal, counts))]
                else:
                    depth = self.planner.chain_depth(seqs, proposal, counts)
                    counts = [min(n, depth) for n in counts]
                num_drafts = torch.tensor(counts, dtype=torch.long)
                k = max(counts)
                draft_tokens = proposal.tokens[:, :k]  # on the drafter's device: read back with the round's result
                draft_probs = proposal.probs[:, :k] if proposal.probs is not None and k else None
        with self._phase("grammar"):
            masks = walk_rows([seq.grammar for seq in seqs], draft_tokens, num_drafts, None)
        if masks:
            draft_tokens, draft_probs = cut_chains(masks, draft_tokens, num_drafts, draft_probs)
        k = draft_tokens.shape[1]
        inputs = torch.cat([pending.to(device), draft_tokens.to(device)], dim=1)
        start = torch.tensor([s.cache_len for s in seqs], dtype=torch.long, device=device)
        # a ragged pass where rows verify different depths: each row scores its own 1 + drafts tokens, no padding
        lengths = num_drafts + 1 if self.ragged_rows and k and int(num_drafts.min()) < k else None
        with self._phase("target"):
            logits, features = self._verify_pass(inputs, start, k, row_lengths=lengths)  # logits [B, k+1, V]
        if masks:
            draft_probs = mask_chains(masks, logits, num_drafts, draft_probs)

        # every row in one batched op (torch.ops.deepspec.*): greedy rows get exactly the target's argmax
        with self._phase("verify"):
            sampling = self._row_sampling()
            # the round's one device-to-host read: how many drafts each row accepted, its next token, its drafts
            result = verify_result(draft_tokens, num_drafts, logits, draft_probs, sampling)
        accepted = [r[0] for r in result]
        committed = [r[2 : 2 + r[0]] + [r[1]] for r in result]
        num_list = num_drafts.tolist()
        with self._phase("logprobs"):
            logprobs = emitted_logprobs(
                logits, [s.params for s in seqs], [list(range(len(c))) for c in committed], committed
            )
        return self._finish_round(committed, accepted, num_list, [None] * B, features, logprobs)

    def _row_sampling(self) -> RowSampling | None:
        """The verify step's per-row sampling: the batch state's parameter tensors (already on the target's
        device) and one fresh seed per row from its request's generator; None when every row is greedy."""
        seqs = self._batch
        if all(s.params.greedy for s in seqs):
            return None
        seeds = [fresh_seed(s.generator) for s in seqs]
        return RowSampling(
            *self.batch_state.sampling_params(len(seqs)),
            torch.tensor(seeds, dtype=torch.int64, device=self.target.device),
        )

    def _verify_pass(
        self,
        inputs: torch.Tensor,
        start: torch.Tensor,
        k: int,
        tree_parents: torch.Tensor | None = None,
        row_lengths: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The target's verify pass over inputs [B, 1 + k] after each row's cache → (logits [B, 1 + k, V], features
        or None; row b's positions past row_lengths[b] zero where given); timed for the planner where it learns from
        served passes."""
        seqs = self._batch
        timed = self.planner.times_passes
        t0 = step_timing.clock() if timed else 0.0
        rows, max_start = self.cache.rows(0, len(seqs)), max(s.cache_len for s in seqs)
        shape = {}  # tree_parents only to targets with tree attention, row_lengths to those with ragged rows
        if tree_parents is not None:
            shape["tree_parents"] = tree_parents
        if row_lengths is not None:
            shape["row_lengths"] = row_lengths
        out = self.target.forward(
            inputs, start, rows, feature_layers=self.feature_layers, logits="all", max_start=max_start, **shape
        )
        if timed:
            tokens = row_lengths.tolist() if row_lengths is not None else [1 + k] * len(seqs)
            self.planner.observe_pass(tokens, [s.cache_len for s in seqs], step_timing.clock() - t0)
        if out.logits is None:
            raise RuntimeError(f"target '{self.target.name}' returned no logits for a verify pass (logits='all')")
        return out.logits, out.features

    def _tree_round(self, proposal: PaddedProposal, caps: list[int], pending: torch.Tensor) -> list[StepOutput]:
        """One round over a token tree: the budget keeps each row's likeliest nodes, the target scores root +
        nodes with tree attention, tree_accept picks each row's accepted path and compact_kv moves its KV entries
        next to the committed prefix."""
        seqs = self._batch
        B = len(seqs)
        device = self.target.device
        with self._phase("budget"):
            num = torch.minimum(proposal.num_tokens.cpu(), torch.tensor(caps))
            parents = proposal.tree_parents().cpu().long()
            try:
                check_parents(with_root(parents, num))
            except ValueError as exc:
                drafter = self.drafter.name if self.drafter is not None else "?"
                raise ValueError(f"drafter '{drafter}' proposed a malformed tree: {exc}") from None
            survival = proposal.survival.cpu() if proposal.survival is not None else None
            proposal = PaddedProposal(proposal.tokens.cpu(), num, proposal.probs, survival, parents)
            proposal = self.planner.keep_tree(seqs, proposal)
        with self._phase("grammar"):
            proposal, masks = cut_tree([seq.grammar for seq in seqs], proposal)
        num = proposal.num_tokens
        k = int(num.max())
        tree_parents = with_root(proposal.tree_parents()[:, :k], num)  # [B, 1+k]
        inputs = torch.cat([pending, proposal.tokens[:, :k]], dim=1)
        start = torch.tensor([s.cache_len for s in seqs], dtype=torch.long, device=device)
        lengths = num + 1 if self.ragged_rows and k and int(num.min()) < k else None  # trees of different sizes
        with self._phase("target"):  # host tree parents: checked free
            logits, features = self._verify_pass(inputs.to(device), start, k, tree_parents if k else None, lengths)
        sampling = self._row_sampling()
        q = None
        if proposal.probs is not None and k:
            probs = proposal.probs[:, :k].to(logits.device)
            q = torch.cat([probs.new_zeros(B, 1, probs.shape[2]), probs], dim=1)
        if masks:
            mask_trees(masks, logits, num, q, tree_parents)
        with self._phase("verify"):
            num_accepted, next_token, path = verify_tree(inputs, tree_parents, num + 1, logits, q, sampling)
            # the round's one read of its result: accepted count, next token and accepted path per row
            result = torch.cat([num_accepted[:, None], next_token[:, None], path], dim=1).tolist()
            accepted, next_tokens, paths = [r[0] for r in result], [r[1] for r in result], [r[2:] for r in result]
        with self._phase("kv"):
            self._tree_cache().keep_path(start, path, num_accepted)
        rows = inputs.tolist()
        committed = [[rows[i][node] for node in paths[i][1 : accepted[i] + 1]] + [next_tokens[i]] for i in range(B)]
        # committed token j was predicted at the path's node j (the root, then each accepted node)
        with self._phase("logprobs"):
            logprobs = emitted_logprobs(
                logits, [s.params for s in seqs], [paths[i][: accepted[i] + 1] for i in range(B)], committed
            )
        depth = node_depths(proposal.tree_parents()[:, :k], num) if k else torch.zeros(B, 0, dtype=torch.long)
        live = torch.arange(k)[None, :] < num[:, None]
        max_depth = torch.where(live, depth, torch.zeros_like(depth)).amax(1).tolist() if k else [0] * B
        if features is not None:  # features[b, j] = the feature at the node before committed token j
            features = features.gather(1, path.clamp(min=0)[:, :, None].expand(-1, -1, features.shape[2]))
        return self._finish_round(committed, accepted, num.tolist(), max_depth, features, logprobs)

    def _tree_cache(self) -> TreeSlotCache:
        """The cache, as one that compacts a verified tree's path: what a target with tree attention allocates."""
        if not isinstance(self.cache, TreeSlotCache):
            raise TypeError(
                f"target '{self.target.name}' has supports_tree_attention but its cache has no keep_path (Target docs)"
            )
        return self.cache

    def forget_acceptance(self) -> None:
        """Start the acceptance prior afresh: after a warm-up request, which is not traffic (a few tokens of a
        throwaway prompt), so what it accepted must not decide whether the next sequences draft."""
        self.planner.forget_acceptance()

    def _finish_round(
        self,
        committed: list[list[int]],
        accepted: list[int],
        num_drafts: list[int],
        depths: Sequence[int | None],
        features: torch.Tensor | None,
        logprobs: list[list[TokenLogprob] | None],
    ) -> list[StepOutput]:
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
                out_i = seq.commit(committed[i], logprobs[i], self.max_seq_len)
                out_i.num_draft_tokens, out_i.num_accepted_tokens = num_drafts[i], n
                out_i.num_verify_tokens = 1 + num_drafts[i]
                results.append(out_i)
                if not seq.finish_reason:
                    self.batch_state.append(i, committed[i])
                    extend_rows.append(i)
                    committed_rows.append(committed[i])
        self.planner.round_done(self._batch, accepted)
        with self._phase("draft_update"):
            self._tell_drafter(extend_rows, committed_rows, features)
        return results

    def _tell_drafter(
        self, extend_rows: list[int], committed_rows: list[list[int]], features: torch.Tensor | None
    ) -> None:
        """A drafter with state of its own is to hear each still-running row's committed tokens and the features
        before each one (the others read them from the batch state). They wait on the sequence until the drafter
        next proposes (`_flush_unheard`): a round that does not draft costs the drafter nothing. Past
        MAX_UNHEARD_TOKENS a row is told at once, so what waits stays small."""
        if self._kv_drafter is None or not extend_rows:
            return
        for i, row in enumerate(extend_rows):
            self._batch[row].hold_unheard(
                committed_rows[i], None if features is None else features[row, : len(committed_rows[i])].clone()
            )
        self._flush_unheard([row for row in extend_rows if self._batch[row].num_unheard > MAX_UNHEARD_TOKENS])

    def _flush_unheard(self, rows: list[int]) -> None:
        """The KV drafter hears what these rows committed since it last heard them, in one call."""
        if self._kv_drafter is None:  # only a KV drafter is told (_tell_drafter)
            return
        rows = [row for row in rows if self._batch[row].unheard]
        if rows:
            self._kv_drafter.commit_rows(rows, *take_unheard([self._batch[row] for row in rows]))

    # ---- bookkeeping -------------------------------------------------------------------------------------------
    def _release(self, finished: list[SequenceState]) -> None:
        """Free finished sequences' slots, keeping the running ones in slots 0..n-1 with every prefilled row before
        every waiting one: a hole among the prefilled rows takes the last prefilled row, and that row's slot the
        last waiting one."""
        for seq in sorted(finished, key=lambda s: s.slot, reverse=True):
            self.planner.finished(seq)
            if seq.params.session is not None:
                self.session_memory.add(seq.params.session, seq.output)
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

    def _forget(self, seq: SequenceState) -> None:
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
    def generate(
        self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams], on_output=None
    ) -> list[GenerationResult]:
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
        return GenerationResult(
            request_id=request_id,
            prompt_token_ids=seq.prompt,
            token_ids=seq.output,
            text=seq.detokenizer.text,
            finish_reason=seq.finish_reason,
            logprobs=seq.logprobs,
            prompt_logprobs=seq.prompt_logprobs,
            **vars(seq.stats),
        )


_ids = itertools.count()
#: committed tokens a sequence may hold back from its KV drafter before it is told anyway (_tell_drafter)
MAX_UNHEARD_TOKENS = 256
#: target → its GrammarCompiler (the compiled vocabulary and grammars), shared by the engines built on it
_GRAMMAR_COMPILERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _request_cap(params: SamplingParams) -> int:
    """The draft tokens a request allows a round (SamplingParams.max_draft_tokens; no limit when it leaves it unset)."""
    return params.max_draft_tokens if params.max_draft_tokens is not None else 1 << 30
