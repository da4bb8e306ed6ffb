"""DFlash drafting: one parallel forward per round proposes the whole block [anchor, MASK × (γ-1)].

Per slot the drafter caches each draft layer's k/v of the context C = norm(fc(F)) at positions 0..a-1 (a = the
anchor's position = number of committed tokens minus one); the anchor is the last committed token. Nothing is
speculative in that cache, so there is nothing to roll back: `commit` just appends.

With `tree_branches` set, the same one forward also yields a token tree (neural.grow_tree): each slot's top tokens
become the children of every expanded node of the depth before.
"""

from __future__ import annotations

import torch

from deepspec.decoding.drafter import DraftSampling, PaddedProposal
from deepspec.decoding.drafters.neural import NeuralDrafter, grow_tree, pack, pick_tokens
from deepspec.models.target import Target


class DFlashDrafter(NeuralDrafter):
    name = "dflash"

    def bind(self, target: Target, max_batch_size: int, max_seq_len: int) -> None:
        self._check_target(target)
        self.caches = [self._new_cache(max_batch_size, max_seq_len) for _ in range(self.cfg.num_layers)]
        self.ctx_len = torch.zeros(max_batch_size, dtype=torch.long)
        self.anchor = torch.zeros(max_batch_size, dtype=torch.long)

    def reset(self, slot: int, first_token: int) -> None:
        self.ctx_len[slot] = 0
        self.anchor[slot] = first_token

    def _commit(self, slots, tokens, num_tokens, features) -> None:
        k0 = self.caches[0][0]
        device = k0.device
        rows = torch.tensor(slots, dtype=torch.long, device=device)
        m = tokens.shape[1]
        positions = self.ctx_len[slots].to(device)[:, None] + torch.arange(m, device=device)
        ctx_kv = self.model.context_kv(self.model.context(features[:, :m].to(device, k0.dtype)), positions)
        heads = torch.arange(self.cfg.num_kv_heads, device=device)[None, :, None]
        index = (rows[:, None, None], heads, positions[:, None, :])
        for (cache_k, cache_v), (k, v) in zip(self.caches, ctx_kv):
            cache_k.index_put_(index, k)
            cache_v.index_put_(index, v)
        for row, slot in enumerate(slots):
            n = int(num_tokens[row])
            self.ctx_len[slot] += n
            self.anchor[slot] = int(tokens[row, n - 1])

    def _block_hidden(self, slots: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """One parallel forward → post-norm hidden [B, γ, H] and base logits U [B, γ, N]."""
        k0 = self.caches[0][0]
        device = k0.device
        γ = self.cfg.block_size
        rows = torch.tensor(slots, dtype=torch.long, device=device)
        ctx_len = self.ctx_len[slots].to(device)
        num_ctx = int(self.ctx_len[slots].max())  # from the host copy: no device read
        block_pos = ctx_len[:, None] + torch.arange(γ, device=device)
        visible_ctx = torch.arange(num_ctx, device=device)[None, None, :] < ctx_len[:, None, None]  # [B, 1, K]
        mask = torch.cat(
            [visible_ctx.expand(-1, γ, -1), torch.ones(len(slots), γ, γ, dtype=torch.bool, device=device)], dim=-1
        )[:, None]
        ctx_kv = [(ck[rows, :, :num_ctx], cv[rows, :, :num_ctx]) for ck, cv in self.caches]
        block_h = self.model.block_input(self.anchor[slots].to(device)[:, None])
        hidden = self.model.blocks(block_h, block_pos, ctx_kv, mask)
        return hidden, self.model.head(hidden)

    def _propose_chain(self, slots: list[int], k: int, sampling: DraftSampling) -> PaddedProposal:
        hidden, logits = self._block_hidden(slots)
        want_probs = not sampling.all_greedy
        tokens, probs = [], [] if want_probs else None
        for j in range(min(k, self.cfg.block_size)):
            ids, p = pick_tokens(logits[:, j], sampling, self.model, want_probs)
            tokens.append(ids)
            if probs is not None:
                probs.append(p)
        num = torch.full((len(slots),), len(tokens), dtype=torch.long)
        return pack(tokens, probs, k, num)

    def _propose_tree(self, slots: list[int], k: int, sampling: DraftSampling) -> PaddedProposal:
        """The block's slots are independent distributions, so every node at depth d has the same candidate
        children (the top tokens of slot d): the tree costs the one block forward and some bookkeeping."""
        _, logits = self._block_hidden(slots)

        def expand(depth, tokens, parent_slot):
            width = 1 if tokens is None else tokens.shape[1]
            return logits[:, depth, None].expand(-1, width, -1), None

        return grow_tree(expand, min(self.cfg.block_size, k), k, self.tree_shape, sampling, self.model)

    def move_slot(self, src: int, dst: int) -> None:
        n = int(self.ctx_len[src])
        for cache_k, cache_v in self.caches:
            cache_k[dst, :, :n] = cache_k[src, :, :n]
            cache_v[dst, :, :n] = cache_v[src, :, :n]
        self.ctx_len[dst] = self.ctx_len[src]
        self.anchor[dst] = self.anchor[src]
