"""Throughput-aware verification budget: verify only as deep as the expected gain pays for the extra work.

Why: a verify pass scores every row at the same depth (rows are padded to the longest block), and on a CPU — or
a GPU at large batch — each extra position costs real time. A drafter that knows how likely each of its slots
is to survive (DSpark: the product of its calibrated confidences) lets the engine pick the depth d that
maximizes modelled throughput

    (rows + Σ_rows Σ_{j<d} survival[row, j]) / t(rows · (d + 1))

where t(n) is the step time of a verify pass over n tokens. This is the "hardware-aware verification budget"
of the DSpark paper, which DeepSpec's code does not have. The step-time model is a least-squares line fitted
on probe passes the engine times once when it starts, on the hardware it runs on; it is not refitted while
serving, so a given batch of seeded requests drafts the same way every time.
"""

from __future__ import annotations

import torch


class StepTimeModel:
    """t(n) = intercept + slope · n seconds for a verify pass over n tokens."""

    def __init__(self, samples: list[tuple[int, float]]):
        if len({n for n, _ in samples}) < 2:
            raise ValueError("a step-time model needs timings at two or more token counts")
        n = torch.tensor([float(s[0]) for s in samples], dtype=torch.float64)
        t = torch.tensor([s[1] for s in samples], dtype=torch.float64)
        n_mean, t_mean = n.mean(), t.mean()
        slope = float(((n - n_mean) * (t - t_mean)).sum() / ((n - n_mean) ** 2).sum())
        self.slope = max(slope, 0.0)  # noise must never make extra tokens look free *and* negative
        self.intercept = max(float(t_mean) - self.slope * float(n_mean), 1e-6)

    def predict(self, num_tokens):
        """Seconds for a pass over num_tokens (an int, or a tensor of counts)."""
        return self.intercept + self.slope * num_tokens

    def __repr__(self) -> str:
        return f"StepTimeModel(t(n) = {self.intercept * 1e3:.2f} ms + {self.slope * 1e3:.3f} ms · n)"


def best_depth(survival: torch.Tensor, model: StepTimeModel) -> int:
    """survival [B, k] (P(slot j and all slots before it accepted); 0 where a row has no draft) → the verify
    depth 0..k with the highest modelled tokens per second."""
    B, k = survival.shape
    gain = torch.cat([torch.zeros(1, dtype=torch.float64), survival.double().sum(0).cumsum(0)])  # [k+1]
    depths = torch.arange(k + 1, dtype=torch.float64)
    throughput = (B + gain) / model.predict(B * (depths + 1))
    return int(throughput.argmax())
