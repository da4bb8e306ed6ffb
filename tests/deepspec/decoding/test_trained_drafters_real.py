"""The shipped drafts (neural and corpus lookup) on the real default target: greedy output token-identical to
target-only on real prompts, and `auto` picks a shipped draft."""

from __future__ import annotations

import pytest

from deepspec.decoding.engine import SpecEngine
from deepspec.decoding.params import SamplingParams
from deepspec.decoding.registry import build_drafter
from deepspec.models.drafts import read_checkpoint_header, shipped_drafts
from tests.conftest import eval_prompts

pytestmark = pytest.mark.slow


def test_shipped_drafts_are_lossless_on_real_prompts(smollm2):
    drafts = shipped_drafts(smollm2)
    assert drafts, (
        "no shipped draft under drafts/ matches the default target: "
        "the fingerprint check or a draft directory is broken"
    )
    prompts = [
        smollm2.encode_chat([{"role": "user", "content": p}])
        for p in eval_prompts("humaneval", 1) + eval_prompts("gsm8k", 1)
    ]
    params = SamplingParams(max_tokens=24)
    base = SpecEngine(smollm2, None, max_batch_size=2, max_seq_len=1024).generate(prompts, params)
    for path, _ in drafts:
        # the verify budget off: whether drafting pays depends on the machine's load (under the full suite's two
        # workers the budget had cut every round of the Eagle3 draft), whether the drafts are right does not
        engine = SpecEngine(smollm2, build_drafter(str(path), smollm2), max_batch_size=2, max_seq_len=1024)
        spec = engine.generate(prompts, params)
        assert [r.token_ids for r in spec] == [r.token_ids for r in base], path.name
        assert sum(r.num_accepted_tokens for r in spec) > 0, f"{path.name} never had a draft accepted"


def test_auto_uses_the_best_shipped_draft_or_prompt_lookup(smollm2):
    from deepspec.decoding.registry import AUTO_MIN_ACCEPTANCE_LENGTH, best_shipped_draft
    from deepspec.models.drafts import _slows_down, shipped_drafts

    best = best_shipped_draft(smollm2)
    good_enough = [
        p
        for p, tau in shipped_drafts(smollm2)
        if tau >= AUTO_MIN_ACCEPTANCE_LENGTH and not _slows_down(p / "eval.json")
    ]
    assert (best is None) == (not good_enough)
    expected = read_checkpoint_header(best)["algo"] if best else "prompt-lookup"
    auto = build_drafter("auto", smollm2)
    assert auto is not None and auto.name == expected
