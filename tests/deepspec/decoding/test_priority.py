"""SamplingParams.priority: a waiting prompt is prefilled before the waiting prompts of a larger priority (lower
first, vLLM's rule), so an interactive request that arrives behind a flood of batch prompts gets its first token
first; what any request generates never depends on it."""

from __future__ import annotations

import pytest

from deepspec.decoding import RequestError, SamplingParams, SpecEngine
from tests.conftest import make_tiny_target


@pytest.fixture(scope="module")
def target():
    return make_tiny_target(eos=False, temperature=4.0)[0]


def _first_token_steps(target, interactive_priority: int) -> tuple[dict[str, int], dict[str, list[int]]]:
    """One decoding row, two long batch prompts waiting on a small prefill budget, then a short interactive prompt:
    → (the step each request's first token came in, every request's output)."""
    engine = SpecEngine(target, None, max_batch_size=4, max_seq_len=128, prefill_tokens_per_step=4)
    engine.add_request("running", [1, 2, 3], SamplingParams(max_tokens=40, priority=2), keep_result=True)
    engine.step()
    for name in ("batch-1", "batch-2"):
        engine.add_request(name, list(range(1, 15)), SamplingParams(max_tokens=4, priority=2), keep_result=True)
    engine.add_request("interactive", [5, 6], SamplingParams(max_tokens=4, priority=interactive_priority), True)
    first: dict[str, int] = {}
    step = 0
    while engine.has_unfinished():
        step += 1
        for out in engine.step():
            first.setdefault(out.request_id, step)
    names = ("running", "batch-1", "batch-2", "interactive")
    return first, {name: engine.pop_result(name).token_ids for name in names}


def test_an_interactive_prompt_is_prefilled_before_batch_prompts_that_wait(target):
    first, outputs = _first_token_steps(target, interactive_priority=0)
    assert first["interactive"] < min(first["batch-1"], first["batch-2"])
    same_priority, same_outputs = _first_token_steps(target, interactive_priority=2)
    assert same_priority["interactive"] > same_priority["batch-1"]  # the control: in arrival order it waits
    assert outputs == same_outputs


def test_a_priority_that_is_not_an_integer_is_refused():
    with pytest.raises(RequestError, match="priority must be an integer"):
        SamplingParams(priority=1.5)  # type: ignore[arg-type]  # the bad input under test
