"""Eagle3 drafting: a chain of γ single-token draft steps against the draft's own per-slot KV cache.

The cache holds one entry per committed pair (F[p-1], x[p]) at position p-1. `propose` drafts from the last
committed pair's output; its speculative entries are simply overwritten when `commit` re-feeds the committed
tokens with the *target's* features from the verify pass (crop to the committed length + re-extend).

With `tree_branches` set it proposes EAGLE-2's dynamic tree instead (`_propose_tree`, neural.grow_tree): one
forward per depth over that depth's expanded nodes, with tree attention inside this same cache.

`backend` picks what runs the draft's forward: `native` drafts in the native decoder's library beside the target
(deepspec/models/native/eagle3.py: the same kernels, auto, int8 or q4 `weights`, a float16 draft cache, the target's
features read where its forward wrote them), `torch` the PyTorch module (any target, and what training runs);
`auto` (the default) is native when the target is the native decoder, torch otherwise. The drafting is the same
either way: the native model answers the module's `cached_step` and `logits`; its `step` also takes fc (a commit)
or the head (a tree depth) into the same call, and its `chain` drafts a whole chain, greedy or sampled, in one call.
"""

from __future__ import annotations

import torch

from deepspec.decoding.drafter import DraftSampling, PaddedProposal
from deepspec.decoding.drafters.neural import CACHE_SLACK, NeuralDrafter, grow_tree, pack, pick_tokens
from deepspec.models.target import Target

#: what runs the draft's forward (see the module docstring)
BACKENDS = ("auto", "native", "torch")


class Eagle3Drafter(NeuralDrafter):
    name = "eagle3"

    def __init__(
        self,
        model,
        tree_depth: int = 6,
        backend: str = "auto",
        weights: str = "auto",
        threads: int | None = None,
        **tree_options,
    ):
        """tree_depth: how deep a tree grows (one draft forward per depth); chains grow k deep. backend: auto, native
        or torch (module docstring); weights: the native draft's matrices, auto (its own 4-bit blocks where it was
        shipped in them, else int8), int8 or q4; threads: the native draft's (default: the target's)."""
        super().__init__(model, **tree_options)
        if tree_depth < 1:
            raise ValueError(f"tree_depth must be >= 1, got {tree_depth}")
        if backend not in BACKENDS:
            raise ValueError(f"eagle3 backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        from deepspec.models.native.eagle3 import DRAFT_WEIGHTS

        if weights not in DRAFT_WEIGHTS:
            raise ValueError(f"eagle3 native weights must be one of {', '.join(DRAFT_WEIGHTS)}, got {weights!r}")
        if threads is not None and threads < 1:
            raise ValueError(f"eagle3 native threads must be >= 1, got {threads}")
        self.backend, self.weights, self.threads = backend, weights, threads
        #: the PyTorch draft; `model` becomes its native stand-in when bind picks the native backend
        self.torch_model = model
        self._native = None  # (target, NativeEagle3): built once per target
        if self.tree is not None and self.tree.width * tree_depth > CACHE_SLACK:
            raise ValueError(
                f"an eagle3 tree of width {self.tree.width} and depth {tree_depth} needs "
                f"{self.tree.width * tree_depth} speculative cache entries; at most {CACHE_SLACK}"
            )
        self.tree_depth = tree_depth

    def bind(self, target: Target, max_batch_size: int, max_seq_len: int) -> None:
        self._check_target(target)
        H = self.cfg.hidden_size
        self.model = self._drafting_model(target, max_seq_len + CACHE_SLACK)
        if self.native:
            self.cache_k, self.cache_v = self.model.new_cache(max_batch_size, max_seq_len + CACHE_SLACK)
            dtype, device = torch.float32, torch.device("cpu")
        else:
            self.cache_k, self.cache_v = self._new_cache(max_batch_size, max_seq_len)
            p = next(self.model.parameters())
            dtype, device = p.dtype, p.device
        self.length = torch.zeros(max_batch_size, dtype=torch.long)  # committed pairs per slot
        self.last_h = torch.zeros(max_batch_size, H, dtype=dtype, device=device)
        self.has_pair = [False] * max_batch_size

    @property
    def native(self) -> bool:
        """Whether the draft's forward runs in the native library (bind decides)."""
        from deepspec.models.native.eagle3 import NativeEagle3

        return isinstance(self.model, NativeEagle3)

    def _drafting_model(self, target: Target, max_positions: int):
        """The PyTorch draft, or its native stand-in (`backend`): built once per target, on the target's threads."""
        from deepspec.models.native.target import NativeTarget

        if self.backend == "torch" or (self.backend == "auto" and not isinstance(target, NativeTarget)):
            return self.torch_model
        if self._native is not None and self._native[0] is target and self._native[1].max_positions >= max_positions:
            return self._native[1]
        from deepspec.models.native.eagle3 import native_eagle3

        if next(self.torch_model.parameters()).device.type != "cpu":
            raise ValueError("the native eagle3 backend drafts on the CPU: load the draft there or use backend=torch")
        threads = self.threads or (target.num_threads if isinstance(target, NativeTarget) else None)
        model = native_eagle3(self.torch_model, weights=self.weights, num_threads=threads, max_positions=max_positions)
        self._native = (target, model)
        return model

    def reset(self, slot: int, first_token: int) -> None:
        self.length[slot] = 0
        self.has_pair[slot] = False

    def _commit(self, slots, tokens, num_tokens, features) -> None:
        device = self.last_h.device
        rows = torch.tensor(slots, dtype=torch.long, device=device)
        m = tokens.shape[1]
        start = self.length[slots].to(device)
        positions = start[:, None] + torch.arange(m, device=device)
        if self.native:  # fc inside the step, reading the features where the target's forward wrote them
            h, _ = self.model.step(None, tokens, positions, self.cache_k, self.cache_v, rows, features=features)
        else:
            h = self.model.cached_step(
                self.model.fc(features[:, :m].to(device, self.last_h.dtype)),
                tokens.to(device),
                positions,
                self.cache_k,
                self.cache_v,
                rows,
                visible=_causal(positions, int(self.length[slots].max()) + m),
            )
        last = (num_tokens.to(device) - 1).clamp(min=0)
        self.last_h[rows] = h[torch.arange(len(slots), device=device), last]
        for row, slot in enumerate(slots):
            self.length[slot] += int(num_tokens[row])
            self.has_pair[slot] = True

    def _propose_chain(self, slots: list[int], k: int, sampling: DraftSampling) -> PaddedProposal:
        device = self.last_h.device
        rows = torch.tensor(slots, dtype=torch.long, device=device)
        want_probs = not sampling.all_greedy
        h = self.last_h[rows][:, None]  # [B, 1, H]
        position = self.length[slots].to(device)[:, None]
        longest = int(self.length[slots].max())  # the lengths live on the host: no device read per step
        num = torch.tensor([k if self.has_pair[s] else 0 for s in slots], dtype=torch.long)
        if self.native:  # the whole chain in one native call
            return self._native_chain(h[:, 0], position[:, 0], rows, k, sampling, want_probs, num)
        tokens, probs = [], [] if want_probs else None
        logits = self.model.logits(h[:, 0])
        for step in range(k):
            ids, p = pick_tokens(logits, sampling, self.model, want_probs)
            tokens.append(ids)
            if probs is not None:
                probs.append(p)
            if step + 1 < k:
                # native: keys up to each position, the library's own causal rule (no mask built)
                visible = None if self.native else _causal(position + step, longest + step + 1)
                h, logits = self._step_logits(h, ids[:, None], position + step, rows, visible=visible)
                logits = logits[:, 0]
        return pack(tokens, probs, k, num)

    def _native_chain(
        self, h, position, rows, k: int, sampling: DraftSampling, want_probs: bool, num
    ) -> PaddedProposal:
        """The chain in one call of the native draft: greedy rows its argmax, sampled rows a draw per token from
        their own generator's uniforms (k per row, drawn up front) by inverse CDF, with the distributions as q."""
        temperature = uniform = None
        if want_probs:
            temperature = sampling.temperature.float().cpu()
            uniform = torch.zeros(len(rows), k)
            generators = sampling.generators_on(torch.device("cpu"))
            for row, t in enumerate(temperature.tolist()):
                if t > 0:
                    uniform[row] = torch.rand(k, generator=generators[row])
        ids, q = self.model.chain(h, position, self.cache_k, self.cache_v, rows, k, temperature, uniform)
        probs = list(self.model.scatter_probs(q).unbind(1)) if q is not None else None
        return pack(list(ids.unbind(1)), probs, k, num)

    def _step_logits(self, h, tokens, positions, rows, cache_index=None, visible=None):
        """One draft step → (h' [B, m, H], its logits [B, m, N]): one native call (the layer and the head), or the
        module's cached_step then its head."""
        if self.native:
            h, logits = self.model.step(
                h, tokens, positions, self.cache_k, self.cache_v, rows, cache_index, visible, logits=True
            )
            assert logits is not None
            return h, logits
        h = self.model.cached_step(h, tokens, positions, self.cache_k, self.cache_v, rows, cache_index, visible)
        return h, self.model.logits(h)

    def _propose_tree(self, slots: list[int], k: int, sampling: DraftSampling) -> PaddedProposal:
        """EAGLE-2's tree: each depth feeds its `width` expanded nodes in one forward. Node j of depth d pairs its
        parent's output h with its token at RoPE position length + d - 1 (where a chain would put it), is written
        to its own cache entry past the committed ones (length + (d-1)·width + j) and sees the committed entries,
        its ancestors' and its own. `commit` overwrites those entries as it does a chain's."""
        device = self.last_h.device
        rows = torch.tensor(slots, dtype=torch.long, device=device)
        longest = int(self.length[slots].max())  # the lengths live on the host: no device read per depth
        length = self.length[slots].to(device)
        B = len(slots)
        state = {"h": self.last_h[rows][:, None], "ancestors": torch.zeros(B, 1, 0, dtype=torch.bool, device=device)}

        def expand(depth, tokens, parent_slot):
            if tokens is None:
                return self.model.logits(state["h"]), None
            w = tokens.shape[1]
            gather = parent_slot.to(device)[:, :, None]
            h = state["h"].gather(1, gather.expand(-1, -1, state["h"].shape[-1]))  # [B, w, H]
            prior = state["ancestors"].gather(1, gather.expand(-1, -1, state["ancestors"].shape[-1]))
            own = torch.eye(w, dtype=torch.bool, device=device)[None].expand(B, -1, -1)
            ancestors = torch.cat([prior, own], dim=-1)  # [B, w, S] over the speculative entries so far
            num_spec = ancestors.shape[-1]
            entries = length[:, None] + torch.arange(num_spec, device=device)  # [B, S] cache entry of each
            num_keys = longest + num_spec
            visible = torch.arange(num_keys, device=device)[None, None, :] < length[:, None, None]
            visible = visible.expand(-1, w, -1).clone().scatter_(2, entries[:, None, :].expand(-1, w, -1), ancestors)
            positions = (length + depth - 1)[:, None].expand(-1, w)
            out, logits = self._step_logits(
                h, tokens.to(device), positions, rows, cache_index=entries[:, -w:], visible=visible
            )
            state["h"], state["ancestors"] = out, ancestors
            return logits, None

        proposal = grow_tree(expand, min(self.tree_depth, k), k, self.tree_shape, sampling, self.model)
        proposal.num_tokens = proposal.num_tokens * torch.tensor([self.has_pair[s] for s in slots], dtype=torch.long)
        return proposal

    def move_slot(self, src: int, dst: int) -> None:
        n = int(self.length[src])
        self.cache_k[dst, :, :n] = self.cache_k[src, :, :n]
        self.cache_v[dst, :, :n] = self.cache_v[src, :, :n]
        self.length[dst] = self.length[src]
        self.last_h[dst] = self.last_h[src]
        self.has_pair[dst] = self.has_pair[src]


def _causal(positions: torch.Tensor, num_keys: int) -> torch.Tensor:
    """[B, m, num_keys] bool: the cache entries each pair at `positions` [B, m] sees (its own and every earlier),
    sized by a key count the caller knows on the host, so attending costs no device-to-host read of the positions."""
    return torch.arange(num_keys, device=positions.device)[None, None, :] <= positions[:, :, None]
