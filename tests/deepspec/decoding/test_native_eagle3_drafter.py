"""The Eagle3 drafter on the native backend (the draft drafted in the native library beside the native target): which
backend it picks, and greedy output identical to target-only at batch 1, 3 (slots moving) and 8, chains and trees, int8
and q4; sampled rows replaying their seeds."""

from __future__ import annotations

import pytest
import torch

from deepspec.decoding.draft_driver import DraftDriver
from deepspec.decoding.drafter import DraftSampling
from deepspec.decoding.drafters.eagle3 import Eagle3Drafter
from deepspec.decoding.engine import SpecEngine
from deepspec.decoding.params import SamplingParams
from deepspec.decoding.registry import load_checkpoint_drafter
from deepspec.models.drafts import save_draft
from deepspec.models.native import native_target_from
from deepspec.models.native.eagle3 import NativeEagle3
from tests.deepspec.decoding.checked import drafter_of, probs_of
from tests.training.helpers import tiny_draft, tiny_target

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11, 12, 13], [14, 15], [16, 17, 18], [19], [20, 21, 22, 23, 24]]


@pytest.fixture(scope="module")
def reference():
    return tiny_target()


@pytest.fixture(scope="module")
def target(reference):
    return native_target_from(reference, num_threads=2)


@pytest.fixture(scope="module")
def draft_dir(target, tmp_path_factory):
    return save_draft(tiny_draft(target, "eagle3", draft_vocab_size=48), tmp_path_factory.mktemp("eagle3") / "d")


def _drafter(draft_dir, target, **options) -> Eagle3Drafter:
    return drafter_of(load_checkpoint_drafter(draft_dir, target, **options), Eagle3Drafter)


@pytest.mark.parametrize("batch", [1, 3, 8])  # 3 < 8 prompts: requests finish and slots move while others run
@pytest.mark.parametrize("options", [{}, {"weights": "q4"}, {"tree_branches": 2, "tree_depth": 3}], ids=str)
def test_greedy_output_is_target_only_output(target, draft_dir, batch, options):
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    base = SpecEngine(target, None, max_batch_size=batch, max_seq_len=128).generate(PROMPTS, params)
    drafter = _drafter(draft_dir, target, **options)
    engine = SpecEngine(target, drafter, max_batch_size=batch, max_seq_len=128, num_speculative_tokens=4)
    spec = engine.generate(PROMPTS, params)
    assert isinstance(drafter.model, NativeEagle3)  # auto: native beside the native target
    assert [r.token_ids for r in spec] == [r.token_ids for r in base]
    assert all(r.num_draft_tokens > 0 for r in spec)
    again = engine.generate(PROMPTS[:2], params)  # a second bind reuses the native model; slots start clean
    assert [r.token_ids for r in again] == [r.token_ids for r in base[:2]]


def test_sampled_rows_draft_step_by_step_and_replay_their_seeds(target, draft_dir):
    drafter = _drafter(draft_dir, target)
    engine = SpecEngine(target, drafter, max_batch_size=4, max_seq_len=128, num_speculative_tokens=4)
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=3, ignore_eos=True)
    first, second = engine.generate(PROMPTS[:4], params), engine.generate(PROMPTS[:4], params)
    assert isinstance(drafter.model, NativeEagle3)
    assert [r.token_ids for r in first] == [r.token_ids for r in second]
    assert sum(r.num_draft_tokens for r in first) > 0
    # a proposal's q: distributions over the target vocabulary, each drawn token inside the draft vocabulary with
    # positive probability under the q it was drawn from
    driver = DraftDriver(drafter, num_slots=4, max_tokens=128)  # the engine has bound it
    driver.start(0, [1, 2, 3], torch.randn(1, 2, drafter.cfg.feature_size))
    driver.start(1, [4, 5], torch.randn(1, 1, drafter.cfg.feature_size))
    sampling = DraftSampling(torch.tensor([1.0, 0.0]), [torch.Generator().manual_seed(0), None])
    prop = driver.propose([0, 1], 4, sampling)
    probs = probs_of(prop)
    assert probs.shape == (2, 4, target.vocab_size)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 4))
    assert (probs[0].gather(-1, prop.tokens[0, :, None]) > 0).all()
    assert bool(torch.isin(prop.tokens, drafter.model.d2t).all())


def test_the_backend_follows_the_target_unless_named(reference, target, draft_dir):
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    on_torch = _drafter(draft_dir, target, backend="torch")
    SpecEngine(target, on_torch, max_batch_size=2, max_seq_len=64).generate(PROMPTS[:2], params)
    assert not isinstance(on_torch.model, NativeEagle3)
    auto = _drafter(draft_dir, reference)  # a PyTorch target: the PyTorch draft
    SpecEngine(reference, auto, max_batch_size=2, max_seq_len=64).generate(PROMPTS[:2], params)
    assert not isinstance(auto.model, NativeEagle3)
    forced = _drafter(draft_dir, reference, backend="native")  # the native draft beside a PyTorch target, exact too
    base = SpecEngine(reference, None, max_batch_size=2, max_seq_len=64).generate(PROMPTS[:4], params)
    spec = SpecEngine(reference, forced, max_batch_size=2, max_seq_len=64, num_speculative_tokens=3).generate(
        PROMPTS[:4], params
    )
    assert isinstance(forced.model, NativeEagle3)
    assert [r.token_ids for r in spec] == [r.token_ids for r in base]


def test_bad_options_are_clear_errors(target, draft_dir):
    with pytest.raises(ValueError, match="backend must be one of"):
        _drafter(draft_dir, target, backend="onnx")
    with pytest.raises(ValueError, match="weights must be one of"):
        _drafter(draft_dir, target, weights="fp8")
