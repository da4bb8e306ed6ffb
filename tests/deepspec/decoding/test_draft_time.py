"""The probe of what a drafted round costs the drafter: one function behind the engine's pricing and the choices made
before serving; a drafter that runs no model is never timed."""

from __future__ import annotations

import pytest

from deepspec.decoding import draft_time
from deepspec.decoding.draft_time import measure_draft_time, runs_a_model
from deepspec.decoding.engine import SpecEngine
from deepspec.decoding.planner import BudgetPlanner
from deepspec.decoding.registry import build_drafter, load_checkpoint_drafter
from deepspec.decoding.verify_budget import DraftTimeModel
from deepspec.models.drafts import save_draft
from tests.training.helpers import tiny_draft, tiny_target


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def dspark_dir(target, tmp_path_factory):
    return save_draft(tiny_draft(target, "dspark", draft_vocab_size=48), tmp_path_factory.mktemp("draft") / "dspark")


def test_a_lookup_drafter_is_not_timed_and_a_neural_one_is_at_batch_1(target, dspark_dir, monkeypatch):
    lookup = build_drafter("prompt-lookup", target)
    assert not runs_a_model(lookup) and not runs_a_model(None)
    monkeypatch.setattr(draft_time, "_time_rounds", lambda *a: pytest.fail("a drafter without a model was timed"))
    assert measure_draft_time(target, lookup, 7) is None and measure_draft_time(target, None, 7) is None
    monkeypatch.undo()
    neural = load_checkpoint_drafter(dspark_dir, target)
    assert runs_a_model(neural)
    model = measure_draft_time(target, neural, 7)
    assert model is not None
    assert model.rows == [1] and set(model.by_width()) == {1, 7}
    assert 0 < model.by_width()[1] <= model.by_width()[7]
    at_width_1 = measure_draft_time(target, load_checkpoint_drafter(dspark_dir, target), 1)
    assert at_width_1 is not None and set(at_width_1.by_width()) == {1}


def test_the_engine_prices_drafting_with_the_same_probe(target, dspark_dir, monkeypatch):
    probed = []
    fake = DraftTimeModel({(r, w): 0.001 * w for r in (1, 2) for w in (1, 4)})
    monkeypatch.setattr(
        draft_time, "_time_rounds", lambda _t, _d, rows, widths, *rest: probed.append((rows, widths)) or fake
    )
    engine = SpecEngine(
        target,
        load_checkpoint_drafter(dspark_dir, target),
        max_batch_size=2,
        max_seq_len=64,
        num_speculative_tokens=4,
        planner=BudgetPlanner(),
    )
    assert probed == [((1, 2), (1, 4))] and engine.planner.draft_time is fake
    SpecEngine(
        target,
        build_drafter("prompt-lookup", target),
        max_batch_size=2,
        max_seq_len=64,
        num_speculative_tokens=4,
        planner=BudgetPlanner(),
    )
    assert len(probed) == 1  # prompt lookup: nothing timed
