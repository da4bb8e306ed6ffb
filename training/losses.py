"""The losses of docs/ALGORITHMS.md, with the index bookkeeping (label shifting, anchors, valid prefixes) kept in
small functions the tests check on hand-built examples.

Two label sources (`train --labels`):
- regen (default): target distributions are never stored: they are `lm_head(final_hidden)` of the frozen target,
  the full-vocabulary softmax gathered onto the draft vocabulary (mass outside it counts as unmatchable), computed
  here from the draft rows of the head and the cached log-sum-exp (`FinalHidden`), or from the whole head without
  it; DFlash's and DSpark's CE read the (target-written) next tokens.
- target: top-k `SoftLabels` from the target's forward over any text (training/distill.py); every draft slot
  trains on the KL to the target's distribution at its position (`*_distill_loss`, DSpark's terms).

Each algorithm's record (deepspec/algorithms) names its training objective, one function with the `Objective`
signature that takes either label source: `eagle3_objective`, `dflash_objective`, `dspark_loss`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from training.distill import SoftLabels, kl_to_labels, l1_to_labels

#: Eagle3 per-step decay of the TTT loss
EAGLE3_STEP_DECAY = 0.8
#: DFlash/DSpark per-slot weight w_j = exp(-j / BLOCK_DECAY)
BLOCK_DECAY = 4.0
#: DSpark: 0.1·CE + 0.9·L1 + 1.0·BCE
DSPARK_WEIGHTS = (0.1, 0.9, 1.0)

#: objective(draft, target, features [B, T, F], labels, tokens [B, T], loss_mask [B, T], anchor generator,
#: num_anchors) -> (loss, metrics): labels is the target's final hidden state [B, T, H] (regen) or its SoftLabels
#: [B, T, k] (target); the block drafts sample num_anchors anchors per row with the generator, others ignore both
Objective = Callable[..., tuple[torch.Tensor, dict]]


@dataclass
class FinalHidden:
    """The target's final hidden state [B, T, H] and the log-sum-exp of its full-vocabulary logits [B, T], as the
    offline cache stores them (`--labels regen`).

    Why the log-sum-exp: the target's probability of draft token i is exp(head[d2t[i]] · h − lse), so with lse
    known only the N draft rows of the head run in the loop instead of all V (49,152 on SmolLM2, 12x the rows of a
    4,096-token draft vocabulary), and the distribution is the same full-vocabulary softmax, not a renormalised
    one."""

    hidden: torch.Tensor
    lse: torch.Tensor

    def __getitem__(self, index) -> FinalHidden:
        return FinalHidden(self.hidden[index], self.lse[index])

    def to(self, device) -> FinalHidden:
        return FinalHidden(self.hidden.to(device), self.lse.to(device))


def full_vocab_lse(target, final_hidden: torch.Tensor) -> torch.Tensor:
    """final_hidden [.., H] → log Σ_v exp(logit_v) over the target's full vocabulary [..], in float32."""
    with torch.no_grad(), torch.autocast(final_hidden.device.type, enabled=False):
        return torch.logsumexp(target.lm_head(final_hidden).float(), dim=-1)


def target_probs(target, final_hidden: torch.Tensor | FinalHidden, d2t: torch.Tensor) -> torch.Tensor:
    """final_hidden [.., H] (or FinalHidden) → the target's softmax over the full vocabulary, gathered at d2t:
    [.., N], in float32 whatever autocast is on (labels are never rounded to bf16)."""
    with torch.no_grad(), torch.autocast(d2t.device.type, enabled=False):
        if isinstance(final_hidden, FinalHidden):
            head = target.embeddings().head.index_select(0, d2t)
            logits = torch.nn.functional.linear(final_hidden.hidden.to(head.dtype), head).float()
            return torch.exp(logits - final_hidden.lse.float()[..., None])
        logits = target.lm_head(final_hidden)
        return torch.softmax(logits.float(), dim=-1).index_select(-1, d2t)


# ---- Eagle3 ---------------------------------------------------------------------------------------------------
def eagle3_valid(loss_mask: torch.Tensor, step: int) -> torch.Tensor:
    """[B, T] → [B, T]: index t of TTT step k is trained iff the token it predicts, x[t+2+k], exists and is an
    assistant token (step k at t feeds x[t+1+k] and predicts the target distribution at position t+1+k)."""
    B, T = loss_mask.shape
    valid = torch.zeros_like(loss_mask, dtype=torch.bool)
    shift = 2 + step
    if shift < T:
        valid[:, : T - shift] = loss_mask[:, shift:].bool()
    return valid


def _eagle3_unrolled_loss(model, features, tokens, loss_mask, step_loss) -> tuple[torch.Tensor, dict]:
    """Σ_k 0.8^k · step_loss over the valid indices of TTT step k, and the per-step top-1 agreement.

    The TTT steps run only at the indices some row trains at some step (`ttt_forward`'s queries): the same loss
    and gradients as unrolling every index, without the γ steps over prompts. `step_loss((rows [m], positions
    [m]), log_q [m, N])` → (mean loss, the target's most likely draft token [m]) for the distribution at
    position t+1+k of each valid query index t."""
    num_steps = model.cfg.block_size
    valid = torch.stack([eagle3_valid(loss_mask, k) for k in range(num_steps)])  # [γ, B, T]
    cols = valid.flatten(0, 1).any(0).nonzero().flatten()  # ascending
    total = features.new_zeros((), dtype=torch.float32)
    metrics = {}
    if cols.numel() == 0:
        return total, metrics
    logits = model.ttt_forward(features, tokens, num_steps, queries=cols[None].expand(tokens.shape[0], -1))
    for k, step_logits in enumerate(logits):
        valid_k = valid[k][:, cols]
        if not bool(valid_k.any()):
            continue
        log_q = F.log_softmax(step_logits[valid_k], dim=-1)
        rows, i = valid_k.nonzero(as_tuple=True)  # row-major, as log_q's rows
        loss, best = step_loss((rows, cols[i] + 1 + k), log_q)
        total = total + EAGLE3_STEP_DECAY**k * loss
        metrics[f"acc{k}"] = float((log_q.argmax(-1) == best).float().mean())
    return total, metrics


def eagle3_loss(model, target, features, final_hidden, tokens, loss_mask) -> tuple[torch.Tensor, dict]:
    """Σ_k 0.8^k · soft-CE(target probs at t+1+k, draft step-k logits at t), mean over valid positions.

    The target distribution at each position is computed once and shared by all steps (step k reads it shifted
    by k); from a FinalHidden only the head's draft-vocabulary rows run (`target_probs`)."""
    needed = torch.zeros_like(loss_mask, dtype=torch.bool)
    needed[:, 1:-1] = loss_mask[:, 2:].bool()  # position q is used iff x[q+1] is an assistant token
    p_all = torch.zeros(*tokens.shape, model.cfg.out_vocab_size, device=features.device)
    p_all[needed] = target_probs(target, final_hidden[needed], model.d2t)

    def soft_ce(at, log_q):
        p_t = p_all[at]  # position t+1+k for index t
        return -(p_t * log_q).sum(-1).mean(), p_t.argmax(-1)

    return _eagle3_unrolled_loss(model, features, tokens, loss_mask, soft_ce)


def eagle3_distill_loss(model, labels: SoftLabels, features, tokens, loss_mask) -> tuple[torch.Tensor, dict]:
    """Σ_k 0.8^k · KL(target distribution at t+1+k ‖ draft step-k at t), mean over the same valid indices as
    `eagle3_loss`; labels [B, T, k] hold the target's distribution at each position."""

    def kl(at, log_q):
        p_t = labels[at]  # the distribution at position t+1+k for index t
        return kl_to_labels(p_t, log_q).mean(), p_t.ids.gather(-1, p_t.probs.argmax(-1, keepdim=True))[:, 0]

    return _eagle3_unrolled_loss(model, features, tokens, loss_mask, kl)


def eagle3_objective(model, target, features, labels, tokens, loss_mask, generator, num_anchors):
    """Eagle3's `Objective`: `eagle3_distill_loss` on SoftLabels, else `eagle3_loss` (no anchors: TTT unrolls
    every position)."""
    if isinstance(labels, SoftLabels):
        return eagle3_distill_loss(model, labels, features, tokens, loss_mask)
    return eagle3_loss(model, target, features, labels, tokens, loss_mask)


# ---- DFlash / DSpark ------------------------------------------------------------------------------------------
def sample_anchors(
    loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random anchor positions a (1 <= a, x[a+1] an assistant token), without replacement per row.

    Returns anchors [B, A] and anchor_valid [B, A] (rows with fewer candidates repeat one, marked invalid)."""
    B, T = loss_mask.shape
    anchors = torch.zeros(B, num_anchors, dtype=torch.long)
    valid = torch.zeros(B, num_anchors, dtype=torch.bool)
    for b in range(B):
        cand = torch.nonzero(loss_mask[b, 2:].bool().cpu()).flatten() + 1  # a with x[a+1] assistant, a >= 1
        if cand.numel() == 0:
            continue
        pick = cand[torch.randperm(cand.numel(), generator=generator)[:num_anchors]].sort().values
        anchors[b, : pick.numel()] = pick
        anchors[b, pick.numel() :] = pick[0]
        valid[b, : pick.numel()] = True
    return anchors.to(loss_mask.device), valid.to(loss_mask.device)


def block_targets(
    tokens: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor, anchor_valid: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Labels of anchor-first blocks: slot j of the block at a predicts x[a+1+j].

    Returns labels [B, A, γ], prev [B, A, γ] = x[a+j] (the Markov head's x_{j-1}; x_{-1} = the anchor) and valid
    [B, A, γ] = the contiguous prefix of slots whose label exists and is an assistant token."""
    B, T = tokens.shape
    j = torch.arange(block_size, device=tokens.device)
    pos = anchors[:, :, None] + 1 + j  # [B, A, γ]
    inside = pos < T
    safe = pos.clamp(max=T - 1)
    labels = tokens.gather(1, safe.flatten(1)).view_as(pos)
    prev = tokens.gather(1, (safe - 1).flatten(1)).view_as(pos)
    ok = inside & loss_mask.gather(1, safe.flatten(1)).view_as(pos).bool() & anchor_valid[:, :, None]
    valid = torch.cumprod(ok.long(), dim=-1).bool()
    return labels, prev, valid


def slot_weights(block_size: int, device=None) -> torch.Tensor:
    return torch.exp(-torch.arange(block_size, device=device, dtype=torch.float32) / BLOCK_DECAY)


def _block_common(model, features, tokens, loss_mask, generator, num_anchors):
    anchors, anchor_valid = sample_anchors(loss_mask, num_anchors, generator)
    labels, prev, valid = block_targets(tokens, loss_mask, anchors, anchor_valid, model.cfg.block_size)
    hidden = model.train_forward(features, tokens, anchors)  # [B, A, γ, H]
    weights = slot_weights(model.cfg.block_size, features.device) * valid.float()  # [B, A, γ]
    return anchors, labels, prev, valid, hidden, weights


def _hard_ce(logits, labels, model, weights):
    draft_labels = model.t2d[labels]
    in_vocab = draft_labels < model.cfg.out_vocab_size
    ce = F.cross_entropy(
        logits.flatten(0, -2), draft_labels.clamp(max=model.cfg.out_vocab_size - 1).flatten(), reduction="none"
    ).view_as(labels)
    w = weights * in_vocab.float()
    return (ce * w).sum() / w.sum().clamp(min=1e-6), w


def dflash_loss(model, target, features, final_hidden, tokens, loss_mask, generator, num_anchors):
    """Position-weighted CE (w_j = exp(-j/4)) over the valid prefix of each block."""
    anchors, labels, prev, valid, hidden, weights = _block_common(
        model, features, tokens, loss_mask, generator, num_anchors
    )
    logits = model.head(hidden)
    loss, _ = _hard_ce(logits, labels, model, weights)
    metrics = _block_metrics(logits, labels, model, valid)
    return loss, metrics


def dflash_distill_loss(model, labels: SoftLabels, features, tokens, loss_mask, generator, num_anchors):
    """Position-weighted (w_j = exp(-j/4)) KL(target distribution at a+j ‖ draft slot j) over the valid prefix of
    each block (slot j predicts x[a+1+j], the token after position a+j)."""
    anchors, _, _, valid, hidden, weights = _block_common(model, features, tokens, loss_mask, generator, num_anchors)
    logits = model.head(hidden)  # [B, A, γ, N]
    p_t = labels.gather_positions(_block_positions(anchors, model.cfg.block_size, tokens.shape[1]))[valid]
    log_q = F.log_softmax(logits[valid], dim=-1)
    w = weights[valid]
    loss = (kl_to_labels(p_t, log_q) * w).sum() / w.sum().clamp(min=1e-6)
    top = p_t.ids.gather(-1, p_t.probs.argmax(-1, keepdim=True))[:, 0]
    hit = torch.zeros_like(valid)
    hit[valid] = log_q.argmax(-1) == top
    run = torch.cumprod(hit.long(), dim=-1).sum(-1).float()
    blocks = valid[..., 0]
    return loss, {
        "acc0": float(hit[..., 0].sum() / blocks.sum().clamp(min=1)),
        "tau": 1 + float(run[blocks].mean()) if bool(blocks.any()) else math.nan,
    }


def dflash_objective(model, target, features, labels, tokens, loss_mask, generator, num_anchors):
    """DFlash's `Objective`: `dflash_distill_loss` on SoftLabels, else `dflash_loss`."""
    if isinstance(labels, SoftLabels):
        return dflash_distill_loss(model, labels, features, tokens, loss_mask, generator, num_anchors)
    return dflash_loss(model, target, features, labels, tokens, loss_mask, generator, num_anchors)


def _block_positions(anchors: torch.Tensor, block_size: int, T: int) -> torch.Tensor:
    """anchors [B, A] → [B, A, γ]: position a+j, whose target distribution slot j predicts (clamped inside T)."""
    return (anchors[:, :, None] + torch.arange(block_size, device=anchors.device)).clamp(max=T - 1)


def _at_positions(final: torch.Tensor | FinalHidden, pos: torch.Tensor) -> torch.Tensor | FinalHidden:
    """final [B, T, H] (or FinalHidden), positions [B, *P] → [B, *P, H] at those positions of each row."""
    if isinstance(final, FinalHidden):
        lse = final.lse.gather(1, pos.flatten(1)).view(pos.shape)
        hidden = _at_positions(final.hidden, pos)
        assert isinstance(hidden, torch.Tensor)
        return FinalHidden(hidden, lse)
    hidden = final.gather(1, pos.flatten(1)[..., None].expand(-1, -1, final.shape[-1]))
    return hidden.view(*pos.shape, -1)


def _dspark_terms(model, target, features, final_hidden, tokens, loss_mask, generator, num_anchors) -> dict:
    """Everything DSpark's loss and its confidence calibration read, over the valid slots of sampled blocks.

    `final_hidden` is the target's final hidden state [B, T, H] or FinalHidden (regen), or its SoftLabels [B, T, k]
    (target)."""
    anchors, labels, prev, valid, hidden, weights = _block_common(
        model, features, tokens, loss_mask, generator, num_anchors
    )
    γ = model.cfg.block_size
    logits, conf = model.step_logits(hidden, model.head(hidden), prev)
    # target distribution at position a+j (it predicts x[a+1+j]), full-vocabulary softmax gathered on d2t
    pos = _block_positions(anchors, γ, tokens.shape[1])
    sel = valid
    p_d = torch.softmax(logits[sel], dim=-1)
    soft = None
    if isinstance(final_hidden, SoftLabels):
        soft = final_hidden.gather_positions(pos)[sel]  # [n, k]
        l1 = l1_to_labels(soft, p_d)
    else:
        p_t = target_probs(target, _at_positions(final_hidden, pos)[sel], model.d2t)  # [n, N]
        outside = (1 - p_t.sum(-1)).clamp(min=0)  # target mass the draft vocabulary cannot cover
        l1 = (p_d - p_t).abs().sum(-1) + outside  # ‖p_d − p_t‖₁ over the full vocabulary
    slot = torch.arange(γ, device=anchors.device).expand_as(valid)[sel]
    return {
        "logits": logits,
        "labels": labels,
        "valid": valid,
        "weights": weights,
        "l1": l1,
        "conf": conf[sel],
        "accept": (1 - 0.5 * l1).detach().clamp(0, 1),
        "slot": slot,
        "soft": soft,
    }


def dspark_loss(model, target, features, final_hidden, tokens, loss_mask, generator, num_anchors):
    """DSpark's `Objective`: 0.1·CE + 0.9·L1(p_d, p_t) + 1.0·BCE(confidence, 1 - ½‖p_d - p_t‖₁), each weighted by
    w_j and validity.

    With SoftLabels (`--labels target`) the CE on the next token becomes the KL to the target's distribution."""
    t = _dspark_terms(model, target, features, final_hidden, tokens, loss_mask, generator, num_anchors)
    w = t["weights"][t["valid"]]
    norm = w.sum().clamp(min=1e-6)
    if t["soft"] is not None:
        ce = (kl_to_labels(t["soft"], F.log_softmax(t["logits"][t["valid"]], dim=-1)) * w).sum() / norm
    else:
        ce, _ = _hard_ce(t["logits"], t["labels"], model, t["weights"])
    bce = F.binary_cross_entropy_with_logits(t["conf"], t["accept"], reduction="none")
    a, b, c = DSPARK_WEIGHTS
    loss = a * ce + b * (t["l1"] * w).sum() / norm + c * (bce * w).sum() / norm
    metrics = _block_metrics(t["logits"], t["labels"], model, t["valid"])
    metrics["accept_rate"] = float((t["accept"] * w).sum() / norm)
    return loss, metrics


@torch.no_grad()
def dspark_confidence_samples(model, target, features, final_hidden, tokens, loss_mask, generator, num_anchors):
    """(confidence logits [n], acceptance probabilities 1 − ½‖p_d − p_t‖₁ [n], slot index [n]) of every valid
    block slot: the pairs `training.calibration` fits the per-slot temperatures on."""
    t = _dspark_terms(model, target, features, final_hidden, tokens, loss_mask, generator, num_anchors)
    return t["conf"], t["accept"], t["slot"]


def _block_metrics(logits, labels, model, valid) -> dict:
    pred = model.to_target_ids(logits.argmax(-1))
    hit = (pred == labels) & valid
    # expected accepted length of greedy drafting on these blocks: contiguous correct prefix
    run = torch.cumprod(hit.long(), dim=-1).sum(-1).float()
    blocks = valid[..., 0]
    return {
        "acc0": float(hit[..., 0].sum() / blocks.sum().clamp(min=1)),
        "tau": 1 + float(run[blocks].mean()) if bool(blocks.any()) else math.nan,
    }
