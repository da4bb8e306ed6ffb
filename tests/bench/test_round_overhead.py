"""bench.round_overhead's draft cost: a chain of draft tokens and a one-token target step timed on the same rows,
for the native Eagle3 draft beside the native target (no timing asserted: what is measured, not how fast)."""

from __future__ import annotations

import pytest

from bench.round_overhead import draft_cost
from deepspec.decoding.drafters.eagle3 import Eagle3Drafter
from deepspec.decoding.registry import load_checkpoint_drafter
from deepspec.models.drafts import save_draft
from deepspec.models.native import native_target_from
from deepspec.models.native.eagle3 import NativeEagle3
from tests.deepspec.decoding.checked import drafter_of
from tests.training.helpers import tiny_draft, tiny_target


@pytest.mark.parametrize("batch", [1, 3])
def test_draft_cost_times_a_native_chain_beside_a_target_step(tmp_path, batch):
    target = native_target_from(tiny_target(), num_threads=1)
    path = save_draft(tiny_draft(target, "eagle3", draft_vocab_size=48), tmp_path)
    drafter = drafter_of(load_checkpoint_drafter(path, target), Eagle3Drafter)
    cost = draft_cost(target, drafter, [1, 2, 3, 4, 5], batch, k=3, repeats=3)
    assert isinstance(drafter.model, NativeEagle3)  # bound to the native target: drafted natively
    assert set(cost) == {
        f"{prefix}{name}"
        for prefix in ("", "fastest_", "cpu_")
        for name in ("draft_ms_per_token", "target_step_ms", "share")
    }
    assert cost["fastest_draft_ms_per_token"] <= cost["draft_ms_per_token"]
    assert cost["share"] == pytest.approx(cost["draft_ms_per_token"] / cost["target_step_ms"])
