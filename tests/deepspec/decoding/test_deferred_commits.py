"""A KV drafter hears committed tokens when it next proposes (SpecEngine._flush_unheard): one commit of several
rounds' tokens leaves it in the state round-by-round commits would, a round that does not draft calls no commit,
and greedy output stays the target's alone."""

from __future__ import annotations

import pytest
import torch

import deepspec.decoding.engine as engine_module
from deepspec.decoding.draft_driver import DraftDriver
from deepspec.decoding.drafters.neural import NeuralDrafter
from deepspec.decoding.engine import SpecEngine
from deepspec.decoding.params import SamplingParams
from deepspec.decoding.planner import BudgetPlanner
from deepspec.decoding.registry import build_drafter
from deepspec.decoding.verify_budget import DraftTimeModel, StepTimeModel
from deepspec.models.drafts import save_draft
from tests.deepspec.decoding.checked import drafter_of
from tests.training.helpers import tiny_draft, tiny_target

ALGOS = ["eagle3", "dflash", "dspark"]


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def draft_dirs(target, tmp_path_factory):
    root = tmp_path_factory.mktemp("drafts")
    return {algo: str(save_draft(tiny_draft(target, algo, draft_vocab_size=48), root / algo)) for algo in ALGOS}


@pytest.mark.parametrize("algo", ALGOS)
def test_one_commit_of_several_rounds_equals_a_commit_per_round(target, draft_dirs, algo):
    torch.manual_seed(0)
    prompt, rounds = [1, 2, 3, 4, 5], [[6, 7], [8], [9, 10, 11]]
    feature_size = drafter_of(build_drafter(draft_dirs[algo], target), NeuralDrafter).cfg.feature_size
    features = [torch.randn(1, len(prompt) - 1, feature_size)] + [torch.randn(1, len(r), feature_size) for r in rounds]
    proposals = []
    for together in (False, True):
        driver = DraftDriver(
            drafter_of(build_drafter(draft_dirs[algo], target), NeuralDrafter),
            num_slots=1,
            max_tokens=64,
            target=target,
        )
        driver.start(0, prompt, features[0])
        if together:
            driver.commit([0], [sum(rounds, [])], torch.cat(features[1:], dim=1))
        else:
            for chunk, f in zip(rounds, features[1:]):
                driver.commit([0], [chunk], f)
        proposals.append(driver.propose([0], 4))
    assert proposals[0].tokens.tolist() == proposals[1].tokens.tolist()
    if proposals[0].survival is not None:
        torch.testing.assert_close(proposals[0].survival, proposals[1].survival, atol=1e-4, rtol=1e-4)


def _engine(target, path, draft_seconds: float):
    drafter = drafter_of(build_drafter(path, target), NeuralDrafter)
    commits = []
    commit = drafter.commit

    def recorded(slots, tokens, num_tokens, features):
        commits.append(list(slots))
        commit(slots, tokens, num_tokens, features)

    drafter.commit = recorded
    engine = SpecEngine(
        target, drafter, max_batch_size=2, max_seq_len=64, num_speculative_tokens=2, planner=BudgetPlanner()
    )
    commits.clear()  # the draft-time probe's, at start
    engine.planner.step_time = StepTimeModel([(1, 1e-3), (9, 1e-3)])  # verify tokens free: the draft's own time decides
    engine.planner.draft_time = DraftTimeModel({(r, w): draft_seconds * w for r in (1, 2) for w in (1, 2)})
    return engine, commits


def test_a_drafter_never_asked_hears_nothing_past_the_prompt_and_one_asked_hears_every_round(
    target, draft_dirs, monkeypatch
):
    prompts, params = [[1, 2, 3, 1, 2, 3]] * 2, SamplingParams(max_tokens=12, ignore_eos=True)
    reference = SpecEngine(target, None, max_batch_size=2, max_seq_len=64).generate(prompts, params)
    slow, slow_commits = _engine(target, draft_dirs["eagle3"], 1.0)
    got = slow.generate(prompts, params)
    assert [r.token_ids for r in got] == [r.token_ids for r in reference]
    assert len(slow_commits) == 2  # each prompt at its prefill (KVDrafter.start), then nothing: no round drafted
    free, free_commits = _engine(target, draft_dirs["eagle3"], 0.0)
    got = free.generate(prompts, params)
    assert [r.token_ids for r in got] == [r.token_ids for r in reference]
    assert len(free_commits) > 2 + 4 and all(r.num_drafted_steps for r in got)
    # what may wait is bounded: past MAX_UNHEARD_TOKENS the drafter is told though it is not asked
    monkeypatch.setattr(engine_module, "MAX_UNHEARD_TOKENS", 3)
    capped, capped_commits = _engine(target, draft_dirs["eagle3"], 1.0)
    got = capped.generate(prompts, params)
    assert [r.token_ids for r in got] == [r.token_ids for r in reference]
    assert len(capped_commits) >= 2 + 2
