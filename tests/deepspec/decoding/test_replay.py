"""What replays exactly, as service/DESIGN.md ("Seeds and replay") and deepspec/decoding/verify.py state it.

- Greedy rows commit the target's argmax at every position, so their output is target-only greedy decoding whatever
  runs beside them, even when the co-runners change how deep each round verifies.
- A seeded sampled request replays exactly on the same engine when it meets the same batch (alone, or the same
  requests joining at the same steps). It does not promise more: how many drafts a round verifies depends on the
  batch (the step's verify-token budget is split across its rows) and on the verify budget's timing probe (the
  machine), and the request's random draws follow its rounds. The last test shows the rounds changing.

The tiny random target of tests/training/helpers.py with prompt lookup on prompts that repeat, so it drafts. Replay is
checked with the timed verify budget on, as the worker runs it; where a test asserts how deep rounds go, the budget
is off, since on a busy CPU the probe may decide that drafting does not pay at all.
"""

from __future__ import annotations

import pytest

from deepspec.decoding.drafters.prompt_lookup import PromptLookupDrafter
from deepspec.decoding.engine import SpecEngine
from deepspec.decoding.params import SamplingParams
from deepspec.decoding.planner import BudgetPlanner
from tests.training.helpers import tiny_target

PROMPT = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
CO_RUNNERS = [[5, 6, 7, 5, 6, 7, 5], [9, 8, 9, 8, 9, 8], [3, 3, 3, 3, 3], [11, 12, 13, 11, 12]]
GREEDY = SamplingParams(max_tokens=24, ignore_eos=True)
#: a verify pass scores at most 10 tokens: alone a row verifies up to k = 4 drafts, beside 4 others 10 // 5 - 1 = 1
MAX_VERIFY_TOKENS = 10


def _sampled(seed: int | None) -> SamplingParams:
    return SamplingParams(max_tokens=24, temperature=1.0, seed=seed, ignore_eos=True)


#: co-runners of every kind; the unseeded one draws its seed from the engine, so it differs from run to run
CO_RUNNER_PARAMS = [_sampled(7), _sampled(None), GREEDY, _sampled(8)]
#: co-runners that replay themselves: the same batch twice is the same rounds twice
SEEDED_CO_RUNNER_PARAMS = [_sampled(7), _sampled(99), GREEDY, _sampled(8)]


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def _engine(target, drafter: bool = True, verify_budget: bool = True) -> SpecEngine:
    return SpecEngine(
        target,
        PromptLookupDrafter(min_ngram=1, max_ngram=3) if drafter else None,
        max_batch_size=5,
        max_seq_len=128,
        num_speculative_tokens=4,
        max_verify_tokens=MAX_VERIFY_TOKENS,
        planner=BudgetPlanner() if verify_budget else None,
    )


@pytest.mark.parametrize("batch", ["alone", "same co-runners"])
def test_a_seeded_sampled_request_replays_on_the_same_engine_and_batch(target, batch):
    engine = _engine(target)
    prompts = [PROMPT] + (CO_RUNNERS if batch != "alone" else [])
    params = [_sampled(seed=1234)] + (SEEDED_CO_RUNNER_PARAMS if batch != "alone" else [])
    first = [r.token_ids for r in engine.generate(prompts, params)]
    again = [r.token_ids for r in engine.generate(prompts, params)]
    assert again == first
    # a fresh engine with the same settings on the same target (its verify budget reuses this process's probe)
    assert [r.token_ids for r in _engine(target).generate(prompts, params)] == first
    # negative control: the seed really decides the draws
    other = engine.generate([PROMPT], _sampled(seed=4321))[0].token_ids
    assert other != first[0]


@pytest.mark.parametrize("verify_budget", [True, False])
def test_greedy_output_is_the_targets_alone_and_beside_co_runners(target, verify_budget):
    reference = _engine(target, drafter=False).generate([PROMPT], GREEDY)[0]
    alone = _engine(target, verify_budget=verify_budget).generate([PROMPT], GREEDY)[0]
    beside = _engine(target, verify_budget=verify_budget).generate([PROMPT] + CO_RUNNERS, [GREEDY] + CO_RUNNER_PARAMS)
    assert alone.token_ids == reference.token_ids
    assert beside[0].token_ids == reference.token_ids
    if not verify_budget:  # the co-runners did change the rounds: alone the request verified deeper blocks
        assert max(alone.proposed_per_position, default=0) and len(alone.proposed_per_position) > 1
        assert len(beside[0].proposed_per_position) <= 1 and alone.num_steps < beside[0].num_steps


def test_co_runners_change_a_sampled_requests_rounds(target):
    """Why sampled replay is promised only for the same batch: beside co-runners the request verifies shallower
    blocks, so its rounds, and the draws made per round, are not those of its run alone."""
    alone = _engine(target, verify_budget=False).generate([PROMPT], _sampled(seed=1234))[0]
    beside = _engine(target, verify_budget=False).generate(
        [PROMPT] + CO_RUNNERS, [_sampled(seed=1234)] + SEEDED_CO_RUNNER_PARAMS
    )[0]
    assert len(alone.proposed_per_position) > 1 and len(beside.proposed_per_position) <= 1
