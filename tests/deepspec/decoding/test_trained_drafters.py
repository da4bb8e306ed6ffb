"""Eagle3, DFlash and DSpark drafters in the engine: lossless greedy output, sampling runs, batching and slot
moves, truncation, and the build_drafter(dir) path."""

from __future__ import annotations

import pytest
import torch

from deepspec.decoding.draft_driver import DraftDriver
from deepspec.decoding.drafter import DraftSampling
from deepspec.decoding.drafters.neural import NeuralDrafter
from deepspec.decoding.engine import SpecEngine
from deepspec.decoding.params import SamplingParams
from deepspec.decoding.registry import build_drafter, load_checkpoint_drafter
from deepspec.models.drafts import save_draft
from tests.deepspec.decoding.checked import drafter_of, probs_of
from tests.training.helpers import tiny_draft, tiny_target

ALGOS = ["eagle3", "dflash", "dspark"]
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11, 12, 13]]


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def _drafter(target, algo, tmp_path, **kw) -> NeuralDrafter:
    path = save_draft(tiny_draft(target, algo, draft_vocab_size=48), tmp_path / algo)
    return drafter_of(load_checkpoint_drafter(path, target, **kw), NeuralDrafter)


@pytest.mark.parametrize("algo", ALGOS)
def test_greedy_output_identical_to_target_only(target, algo, tmp_path):
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    base = SpecEngine(target, None, max_batch_size=2, max_seq_len=128).generate(PROMPTS, params)
    # batch 2 < 4 prompts: requests finish and slots move while others run; the timed verify budget is off so every
    # round verifies drafts however loaded the CPU is (an untrained draft's record would otherwise stop drafting)
    engine = SpecEngine(
        target, _drafter(target, algo, tmp_path), max_batch_size=2, max_seq_len=128, num_speculative_tokens=4
    )
    spec = engine.generate(PROMPTS, params)
    assert [r.token_ids for r in spec] == [r.token_ids for r in base]
    assert all(r.num_draft_tokens > 0 for r in spec)


@pytest.mark.parametrize("algo", ALGOS)
def test_sampling_is_seeded_and_returns_exact_probs(target, algo, tmp_path):
    engine = SpecEngine(
        target, _drafter(target, algo, tmp_path), max_batch_size=4, max_seq_len=128, num_speculative_tokens=4
    )
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=3, ignore_eos=True)
    a = engine.generate(PROMPTS, params)
    b = engine.generate(PROMPTS, params)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    drafter = drafter_of(engine.drafter, NeuralDrafter)
    driver = DraftDriver(drafter, num_slots=4, max_tokens=128)  # the engine has bound it
    driver.start(0, [1, 2, 3], torch.randn(1, 2, drafter.cfg.feature_size))
    prop = driver.propose([0], 4, DraftSampling(torch.tensor([1.0]), [torch.Generator().manual_seed(0)]))
    n, probs = int(prop.num_tokens[0]), probs_of(prop)
    assert probs.shape == (1, 4, target.vocab_size) and n >= 1
    assert torch.allclose(probs[0, :n].sum(-1), torch.ones(n))
    # every proposed token has positive probability under the q it was drawn from, and lies in the draft vocab
    q = probs[0, :n].gather(-1, prop.tokens[0, :n, None])
    assert (q > 0).all() and bool(torch.isin(prop.tokens, drafter.model.d2t).all())


def test_dspark_truncates_on_low_confidence(target, tmp_path):
    drafter = _drafter(target, "dspark", tmp_path, confidence_threshold=0.99)
    with torch.no_grad():
        drafter.model.confidence.bias.fill_(-5.0)  # c ≈ 0.007 everywhere: only the first slot survives
    driver = DraftDriver(drafter, num_slots=2, max_tokens=64, target=target)
    driver.start(0, [1, 2, 3], torch.randn(1, 2, drafter.cfg.feature_size))
    prop = driver.propose([0], 4, DraftSampling(torch.tensor([0.0]), [None]))
    assert prop.num_tokens.tolist() == [1]


def test_dspark_truncation_uses_the_calibrated_slot_temperatures(target, tmp_path):
    """Confidence logit +1 everywhere: σ(1) ≈ 0.73 keeps two slots above survival 0.5; a calibrated T = 8 on slot 0
    (σ(1/8) ≈ 0.53) drops survival below 0.5 at slot 1 already."""
    drafter = _drafter(target, "dspark", tmp_path, confidence_threshold=0.5)
    with torch.no_grad():
        drafter.model.confidence.weight.zero_()
        drafter.model.confidence.bias.fill_(1.0)
    driver = DraftDriver(drafter, num_slots=2, max_tokens=64, target=target)

    def num_proposed() -> int:
        driver.start(0, [1, 2, 3], torch.randn(1, 2, drafter.cfg.feature_size))
        num = int(driver.propose([0], 4, DraftSampling(torch.tensor([0.0]), [None])).num_tokens[0])
        driver.release(0)
        return num

    assert num_proposed() == 2  # survival 0.73, 0.53, 0.39
    drafter.model.cfg.confidence_temperature = (8.0, 1.0, 1.0, 1.0)
    assert num_proposed() == 1  # survival 0.53, 0.39


def test_build_drafter_loads_checkpoint_dirs(target, tmp_path):
    path = save_draft(tiny_draft(target, "dflash"), tmp_path / "d")
    drafter = build_drafter(str(path), target)
    assert drafter is not None and drafter.name == "dflash" and drafter.feature_layers == (0, 1, 2)
