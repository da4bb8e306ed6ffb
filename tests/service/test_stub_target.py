"""The stub target the service tests run under the real engine: a Target, deterministic, and exact under drafts."""

from __future__ import annotations

import pytest

from deepspec.decoding import RequestError, RequestErrorCode, SamplingParams, SpecEngine, build_drafter
from deepspec.decoding.validation import RequestErrorCode as EngineCodes
from deepspec.models import Target
from deepspec_protocol import worker as p
from service.worker.stub_target import STUB_TEXT, StubDrafter, StubTarget

PROMPTS = [list(b"Hello"), list(b"ok"), list(b"The"), list(b"x" * 600), list(b"<|user|>hi\n<|assistant|>")]


def _texts(engine: SpecEngine, prompts, **params) -> list[str]:
    return [r.text for r in engine.generate(prompts, SamplingParams(max_tokens=60, **params))]


def test_stub_is_a_target_and_writes_the_cycle_from_its_start():
    target = StubTarget()
    assert isinstance(target, Target)
    texts = _texts(SpecEngine(target, None, max_batch_size=2, prefill_chunk_size=256), PROMPTS)
    cycle = (STUB_TEXT * 3)[:60]
    # a prompt that already spells the start of the cycle is continued; every other prompt starts it
    assert texts == [cycle, cycle, (STUB_TEXT * 3)[3:63], cycle, cycle]


@pytest.mark.parametrize("drafter", [StubDrafter(), build_drafter("prompt-lookup", StubTarget())])
@pytest.mark.parametrize("temperature", [0.0, 1.5])
def test_drafts_and_sampling_change_nothing_but_the_counts(drafter, temperature):
    target = StubTarget()
    plain = _texts(SpecEngine(target, None, max_batch_size=3), PROMPTS, temperature=temperature)
    engine = SpecEngine(target, drafter, max_batch_size=3, num_speculative_tokens=4)
    results = engine.generate(PROMPTS, SamplingParams(max_tokens=60, temperature=temperature))
    assert [r.text for r in results] == plain
    assert all(r.num_draft_tokens > 0 and r.num_accepted_tokens > 0 for r in results)


def test_stub_drafter_acceptance_cycles_through_every_depth():
    engine = SpecEngine(StubTarget(), StubDrafter(), max_batch_size=1, num_speculative_tokens=3)
    outputs = []
    engine.generate([list(b"Hi")], SamplingParams(max_tokens=40), on_output=outputs.append)
    accepted = [o.num_accepted_tokens for o in outputs]  # the first step is the prefill and round 0
    assert accepted[:8] == [0, 1, 2, 3, 0, 1, 2, 3]


def test_step_delay_is_per_forward():
    import time

    target = StubTarget(step_delay_s=0.02)
    engine = SpecEngine(target, None, max_batch_size=1)
    t0 = time.perf_counter()
    engine.generate([[1]], SamplingParams(max_tokens=3))  # prefill + 2 decode rounds
    assert time.perf_counter() - t0 >= 0.06


def test_engine_validation_under_the_stub_names_the_code():
    engine = SpecEngine(StubTarget(max_seq_len=64), None, max_batch_size=1)
    with pytest.raises(RequestError) as info:
        engine.add_request("a", list(b"x" * 60), SamplingParams(max_tokens=10))
    assert info.value.code is RequestErrorCode.CONTEXT_TOO_LONG and "at most 4" in info.value.message


def test_protocol_error_codes_mirror_the_engines():
    """The gateway image has no deepspec library: deepspec_protocol/worker.py keeps the code strings, which must
    agree."""
    assert set(p.ERROR_CODES) == {c.value for c in EngineCodes}


def test_protocol_structured_output_kinds_mirror_the_engines():
    from deepspec.decoding.structured import KINDS

    assert p.STRUCTURED_OUTPUT_KINDS == KINDS


def test_protocol_logprobs_bound_mirrors_the_engines():
    from deepspec.decoding.logprobs import MAX_TOP_LOGPROBS

    assert p.MAX_TOP_LOGPROBS == MAX_TOP_LOGPROBS


def test_protocol_logprobs_modes_mirror_the_engines():
    from deepspec.decoding.logprobs import LOGPROBS_MODES

    assert p.LOGPROBS_MODES == LOGPROBS_MODES
