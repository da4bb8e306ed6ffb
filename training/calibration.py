"""DSpark confidence calibration: one temperature per block slot, fitted on training sequences held out of training.

Why: the confidence head learns P(slot accepted | earlier slots accepted) in-sample, so on new text it is
over-confident, and truncation compares the *product* Π σ(c_k) with a threshold — per-slot errors compound down
the block. Temperature scaling σ(c_k / T_k) per slot is the paper's calibration (the reference implementation has
none). It is fitted here on rows the draft never trained on, never on the eval sets, by minimizing the same binary
cross-entropy the head trains with, toward the acceptance probability 1 − ½‖p_d − p_t‖₁.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from training.losses import dspark_confidence_samples

#: candidate temperatures, log-spaced (a grid search on one scalar per slot: exact enough, and never diverges)
TEMPERATURE_GRID = torch.exp(torch.linspace(math.log(0.25), math.log(8.0), 61))
#: below this many held-out samples a slot keeps T = 1
MIN_SLOT_SAMPLES = 16


def fit_slot_temperatures(
    conf: torch.Tensor, accept: torch.Tensor, slot: torch.Tensor, block_size: int
) -> tuple[list[float], list[dict]]:
    """conf logits [n], acceptance probabilities [n], slot index [n] → (T per slot, a report row per slot)."""
    temps, report = [], []
    for j in range(block_size):
        sel = slot == j
        n = int(sel.sum())
        if n < MIN_SLOT_SAMPLES:
            temps.append(1.0)
            report.append({"slot": j, "samples": n, "temperature": 1.0})
            continue
        c, a = conf[sel].float(), accept[sel].float()
        losses = torch.stack([F.binary_cross_entropy_with_logits(c / t, a) for t in TEMPERATURE_GRID])
        best = float(TEMPERATURE_GRID[int(losses.argmin())])
        temps.append(round(best, 4))
        report.append(
            {
                "slot": j,
                "samples": n,
                "temperature": round(best, 4),
                "bce_uncalibrated": round(float(F.binary_cross_entropy_with_logits(c, a)), 5),
                "bce_calibrated": round(float(losses.min()), 5),
                "mean_confidence_uncalibrated": round(float(torch.sigmoid(c).mean()), 4),
                "mean_confidence_calibrated": round(float(torch.sigmoid(c / best).mean()), 4),
                "mean_acceptance": round(float(a.mean()), 4),
            }
        )
    return temps, report


@torch.no_grad()
def calibrate_confidence(
    draft, target, features_source, sequences, indices: list[int], num_anchors: int, seed: int
) -> tuple[list[float], list[dict]]:
    """Run the trained DSpark draft over the held-out sequences `indices` and fit its per-slot temperatures."""
    generator = torch.Generator().manual_seed(seed)
    confs, accepts, slots = [], [], []
    was_training = draft.training
    draft.eval()
    device = target.device
    for i in indices:
        tokens = torch.tensor([sequences[i].input_ids], device=device)
        mask = torch.tensor([sequences[i].loss_mask], device=device)
        features, labels = features_source([i], tokens)  # final hidden state [1, T, H] or SoftLabels
        labels = labels.float() if isinstance(labels, torch.Tensor) else labels
        c, a, s = dspark_confidence_samples(
            draft, target, features.float(), labels, tokens, mask, generator, num_anchors
        )
        confs.append(c.cpu())
        accepts.append(a.cpu())
        slots.append(s.cpu())
    draft.train(was_training)
    if not confs:
        return [1.0] * draft.cfg.block_size, []
    return fit_slot_temperatures(torch.cat(confs), torch.cat(accepts), torch.cat(slots), draft.cfg.block_size)


def calibrate_dspark(
    draft, target, features_source, sequences, indices: list[int], num_anchors: int, seed: int
) -> list[dict]:
    """DSpark's `calibrate` (its algorithm record): fit the per-slot temperatures on the held-out rows into
    draft.cfg.confidence_temperature, which save_draft writes to config.json; returns the report per slot."""
    temps, report = calibrate_confidence(draft, target, features_source, sequences, indices, num_anchors, seed)
    draft.cfg.confidence_temperature = tuple(temps)
    return report
