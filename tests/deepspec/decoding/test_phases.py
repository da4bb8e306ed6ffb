"""The engine's phase timer (deepspec/decoding/phases.py): off by default, and when on it bills every step's time to
the phases the step ran, the target's forward apart from the engine's own work."""

from __future__ import annotations

import pytest

from deepspec.decoding.drafters.prompt_lookup import PromptLookupDrafter
from deepspec.decoding.drafters.random import RandomDrafter
from deepspec.decoding.engine import SpecEngine
from deepspec.decoding.params import SamplingParams
from deepspec.decoding.phases import PHASES
from tests.training.helpers import tiny_target

PROMPTS = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 6, 4, 5, 6]]


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.mark.parametrize(
    "drafter", [None, PromptLookupDrafter(), RandomDrafter(16, seed=1, tree=True)], ids=["none", "chain", "tree"]
)
def test_a_profiled_engine_bills_each_step_to_its_phases(target, drafter):
    engine = SpecEngine(target, drafter, max_batch_size=2, max_seq_len=128, num_speculative_tokens=3)
    engine.generate(PROMPTS, SamplingParams(max_tokens=4, ignore_eos=True))
    timer = engine.profile()
    steps = 0
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=6, ignore_eos=True, logprobs=1))
    while engine.has_unfinished():
        engine.step()
        steps += 1
    assert timer.calls["step"] == steps and timer.calls["prefill"] == steps
    assert timer.calls["target"] == steps  # the first step's prefill completes, and its rows decode at once
    expected = {"target", "verify", "commit", "logprobs", "draft_update", "release", "prefill"}
    expected |= {"draft", "budget"} if drafter is not None else set()
    expected |= {"kv"} if drafter is not None and getattr(drafter, "tree", False) else set()
    assert expected <= set(timer.seconds) <= {*PHASES, "step"}
    per_step = timer.per_step_ms()
    assert sum(per_step.values()) == pytest.approx(timer.seconds["step"] * 1e3 / steps, rel=1e-6)


def test_profiling_one_engine_times_no_other(target):
    profiled = SpecEngine(target, PromptLookupDrafter(), max_batch_size=1, max_seq_len=64, num_speculative_tokens=3)
    timer = profiled.profile()
    SpecEngine(target, PromptLookupDrafter(), max_batch_size=1, max_seq_len=64).generate(
        [PROMPTS[0]], SamplingParams(max_tokens=4)
    )
    assert not timer.calls
