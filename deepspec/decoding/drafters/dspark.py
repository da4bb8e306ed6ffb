"""DSpark drafting: the DFlash block forward, then a left-to-right Markov walk with confidence truncation.

Slot k's logits are U_k + W2·W1[x_{k-1}] (x_{-1} = the anchor); each draft is drawn from that exact softmax, so
rejection sampling stays lossless. The confidence head estimates P(slot k accepted | earlier accepted); the
block stops at the first slot whose survival Π c drops below `confidence_threshold` (always ≥ 1 draft), so weak
tails are never sent to verification — which matters when verification is not free (batched serving, GPUs).
"""

from __future__ import annotations

import torch

from deepspec.decoding.drafter import DraftSampling, PaddedProposal
from deepspec.decoding.drafters.dflash import DFlashDrafter
from deepspec.decoding.drafters.neural import grow_tree, pack, pick_tokens


class DSparkDrafter(DFlashDrafter):
    name = "dspark"

    def __init__(self, model, confidence_threshold: float | None = None, **tree_options):
        super().__init__(model, **tree_options)
        #: survival threshold of dynamic truncation; 0 = never truncate
        self.confidence_threshold = (
            model.cfg.confidence_threshold if confidence_threshold is None else confidence_threshold
        )

    def _propose_chain(self, slots: list[int], k: int, sampling: DraftSampling) -> PaddedProposal:
        hidden, base = self._block_hidden(slots)
        want_probs = not sampling.all_greedy
        prev = self.anchor[slots].to(hidden.device)
        survival = torch.ones(len(slots), device=hidden.device)
        num = torch.zeros(len(slots), dtype=torch.long, device=hidden.device)
        alive = torch.ones(len(slots), dtype=torch.bool, device=hidden.device)
        tokens, probs, survivals = [], [] if want_probs else None, []
        for j in range(min(k, self.cfg.block_size)):
            logits, conf = self.model.step_logits(hidden[:, j], base[:, j], prev)
            ids, p = pick_tokens(logits, sampling, self.model, want_probs)
            survival = survival * self.model.calibrated(conf, j)
            # a row keeps drafting while its survival stays above the threshold (its first draft is always kept)
            alive = alive & ((survival >= self.confidence_threshold) | (j == 0))
            num += alive.long()
            tokens.append(ids)
            survivals.append(survival)
            if probs is not None:
                probs.append(p)
            prev = ids
        # no early exit once every row is truncated: asking the device whether any is alive would cost a read per
        # slot, more than the slot's small Markov step; the truncated slots are cut by `num`
        return pack(tokens, probs, k, num, survivals)

    def _propose_tree(self, slots: list[int], k: int, sampling: DraftSampling) -> PaddedProposal:
        """Slot d's distribution depends on the previous token only through the rank-r Markov term, so each
        expanded node's children cost one small product on top of the one block forward; survival is the
        calibrated confidence product, and the confidence threshold drops the nodes below it."""
        hidden, base = self._block_hidden(slots)
        anchor = self.anchor[slots].to(hidden.device)[:, None]

        def expand(depth, tokens, parent_slot):
            prev = anchor if tokens is None else tokens.to(hidden.device)
            w = prev.shape[1]
            return self.model.step_logits(
                hidden[:, depth, None].expand(-1, w, -1), base[:, depth, None].expand(-1, w, -1), prev
            )

        return grow_tree(
            expand,
            min(self.cfg.block_size, k),
            k,
            self.tree_shape,
            sampling,
            self.model,
            calibrate=self.model.calibrated,
            threshold=self.confidence_threshold,
        )
