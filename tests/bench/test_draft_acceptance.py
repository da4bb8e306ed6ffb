"""bench/draft_acceptance.py's pricing: every decode round is priced by the step curve at its size and context, so a
draft the budget keeps verifying is credited with what its rounds would cost, and target-only with its own."""

from __future__ import annotations

import pytest

from bench.draft_acceptance import PricedTarget, modelled_speedup
from deepspec.decoding.verify_budget import StepTimeModel
from service.worker.stub_target import StubDrafter, StubTarget

#: a flat curve: a pass of up to 5 tokens costs what one token does, so every draft the stub accepts is profit
FLAT = StepTimeModel([(1, 0.005), (5, 0.005), (16, 0.02)])
#: a steep one: each token a step's worth, so no depth pays and the budget verifies target-only
STEEP = StepTimeModel([(1, 0.005), (16, 0.08)])


def test_a_priced_target_adds_up_its_decode_rounds():
    import torch

    priced = PricedTarget(StubTarget(), FLAT)
    cache = priced.new_cache(1, 64).rows(0, 1)
    priced.forward(torch.tensor([[1, 2, 3]]), torch.tensor([0]), cache)
    priced.forward(torch.tensor([[4, 5]]), torch.tensor([3]), cache)
    assert priced.seconds == pytest.approx(0.005 + 0.005)


@pytest.mark.parametrize("curve, gain", [(FLAT, True), (STEEP, False)])
def test_the_modelled_speedup_follows_the_curve(curve, gain):
    target = StubTarget()
    prompts = [target.encode(f"Tell me about fox number {i}. ") for i in range(2)]
    base, _ = modelled_speedup(target, curve, None, prompts, 48, 4)
    _, speedup = modelled_speedup(target, curve, StubDrafter(), prompts, 48, 4, base)
    assert (speedup > 1.5) if gain else (speedup == pytest.approx(1.0, abs=0.02))
