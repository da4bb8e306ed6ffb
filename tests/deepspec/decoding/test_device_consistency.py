"""The engine on a CUDA target, every drafter and both kinds of sampling: no op may mix devices.

There is no GPU here, so the target runs on the fake CUDA device of tests/deepspec/decoding/fake_cuda.py: CPU tensors
that report `cuda:0` and raise what CUDA raises when an op meets a CPU tensor that is not a 0-dim scalar, or a
generator of another device (pytorch/pytorch: `at::check_generator` in aten/src/ATen/core/Generator.h). The values
are computed on the CPU, so greedy output must equal the CPU run's token for token; seeded sampling must replay exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from deepspec.decoding.drafter import DraftSampling
from deepspec.decoding.drafters.corpus_lookup import save_corpus
from deepspec.decoding.drafters.hybrid import save_hybrid
from deepspec.decoding.drafters.prompt_lookup import PromptLookupDrafter
from deepspec.decoding.drafters.random import RandomDrafter
from deepspec.decoding.drafters.suffix_index import SEPARATOR, SuffixIndex
from deepspec.decoding.engine import SpecEngine
from deepspec.decoding.params import SamplingParams
from deepspec.decoding.planner import BudgetPlanner
from deepspec.decoding.registry import build_drafter, load_checkpoint_drafter
from deepspec.models import pytorch_decoder
from deepspec.models.drafts import save_draft
from tests.deepspec.decoding.fake_cuda import CUDA, fake_cuda
from tests.training.helpers import target_sequences, tiny_draft, tiny_target

PROMPTS = [[1, 2, 3, 1, 2], [4, 5, 6, 7, 8], [9], [10, 11, 12, 13, 10, 11]]
GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)


def _sampled(max_tokens: int, seed: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed, ignore_eos=True)


#: at batch 2, one run goes through all three kinds of batch: rows 0 and 1 all greedy; row 0 ends after 4 tokens
#: and sampled row 2 joins greedy row 1 (mixed, slots move); row 1 ends and sampled row 3 joins row 2 (all sampled)
MIXED = [
    SamplingParams(max_tokens=4, ignore_eos=True),
    SamplingParams(max_tokens=8, ignore_eos=True),
    _sampled(10, seed=0),
    _sampled(6, seed=2),
]
GREEDY_ROWS = (0, 1)


@pytest.fixture(scope="module")
def targets():
    """(cpu target, cuda target): the same weights (tiny_target is seeded), one copy moved to the fake cuda."""
    cpu = tiny_target()
    cuda = tiny_target()
    with fake_cuda():
        pytorch_decoder(cuda).to("cuda")
    assert cuda.device == CUDA and cpu.device.type == "cpu"
    return cpu, cuda


@pytest.fixture(scope="module")
def draft_dirs(targets, tmp_path_factory):
    """Draft directories built on the CPU target: a tiny untrained draft per neural algorithm (reduced vocabulary),
    a corpus of the target's own greedy answers, and hybrids of the corpus with a DSpark tree."""
    cpu, _ = targets
    root = tmp_path_factory.mktemp("drafts")
    dirs = {
        algo: save_draft(tiny_draft(cpu, algo, draft_vocab_size=48), root / algo)
        for algo in ("eagle3", "dflash", "dspark")
    }
    answers = sum((s + [SEPARATOR] for s in target_sequences(cpu, 6, 24, seed=4)), [])
    answers += sum((p + s[len(p) :] + [SEPARATOR] for p, s in zip(PROMPTS, target_sequences(cpu, 4, 20))), [])
    dirs["corpus"] = save_corpus(root / "corpus", SuffixIndex.build(np.array(answers), max_match=8), cpu.fingerprint())
    for mode in ("switch", "merge"):
        dirs[f"hybrid-{mode}"] = save_hybrid(
            root / f"hybrid-{mode}",
            dirs["corpus"],
            dirs["dspark"],
            min_match=3,
            mode=mode,
            neural_options={"tree_branches": 2},
        )
    return dirs


def _corpus(dirs, target, **options):
    return load_checkpoint_drafter(dirs["corpus"], target, **options)


def _checkpoint(algo: str, **options):
    """How to build the `algo` draft for a target from its directory (with `options`)."""
    return lambda dirs, target: load_checkpoint_drafter(dirs[algo], target, **options)


#: drafter name → how to build it for a target, given the draft directories
DRAFTERS = {
    "none": lambda dirs, target: None,
    "prompt-lookup": lambda dirs, target: PromptLookupDrafter(),
    "random-chain": lambda dirs, target: RandomDrafter(target.vocab_size, sample_probs=True),
    "random-tree": lambda dirs, target: RandomDrafter(target.vocab_size, sample_probs=True, tree=True),
    "corpus-chain": lambda dirs, target: _corpus(dirs, target),
    "corpus-tree": lambda dirs, target: _corpus(dirs, target, tree=True, sampled=True),
    **{f"{algo}-chain": _checkpoint(algo) for algo in ("eagle3", "dflash", "dspark")},
    **{f"{algo}-tree": _checkpoint(algo, tree_branches=2) for algo in ("eagle3", "dflash", "dspark")},
    "hybrid-switch": lambda dirs, target: build_drafter(str(dirs["hybrid-switch"]), target),
    "hybrid-merge": lambda dirs, target: build_drafter(str(dirs["hybrid-merge"]), target),
}


def _engine(target, drafter, verify_budget: bool = False) -> SpecEngine:
    # batch 2 < 4 prompts: requests finish and slots move while others run
    return SpecEngine(
        target,
        drafter,
        max_batch_size=2,
        max_seq_len=64,
        num_speculative_tokens=5,
        planner=BudgetPlanner() if verify_budget else None,
    )


def _run(target, dirs, name, params, verify_budget=False):
    engine = _engine(target, DRAFTERS[name](dirs, target), verify_budget)
    return engine.generate(PROMPTS, params)


@pytest.fixture(scope="module")
def greedy_reference(targets):
    """The CPU target's own greedy answers: what every greedy row must produce, whatever drafts and device."""
    cpu, _ = targets
    return [r.token_ids for r in _engine(cpu, None).generate(PROMPTS, GREEDY)]


@pytest.fixture(scope="module")
def mixed_on_cuda(targets, draft_dirs):
    """name → (each row's tokens, draft tokens proposed) of one MIXED run of that drafter on the cuda target, run
    once and shared by the tests below: each run costs seconds of dispatch through the fake device."""
    runs = {}

    def run(name: str) -> tuple[list[list[int]], int]:
        if name not in runs:
            with fake_cuda():
                got = _run(targets[1], draft_dirs, name, MIXED)
            runs[name] = [r.token_ids for r in got], sum(r.num_draft_tokens for r in got)
        return runs[name]

    return run


def _assert_greedy_rows_are_the_targets(got: list[list[int]], greedy_reference) -> None:
    for i in GREEDY_ROWS:
        assert got[i] == greedy_reference[i][: MIXED[i].max_tokens], i


@pytest.mark.parametrize("name", DRAFTERS)
def test_every_kind_of_batch_on_cuda(targets, mixed_on_cuda, greedy_reference, name):
    """Greedy rows on the cuda target equal the CPU target's own greedy answers token for token, whether their
    batch is all greedy or shares it with a sampled row; sampled rows draw their drafts on the device with the
    request's device generator, in a mixed batch and in an all-sampled one."""
    _, cuda = targets
    got, draft_tokens = mixed_on_cuda(name)
    _assert_greedy_rows_are_the_targets(got, greedy_reference)
    assert [len(t) for t in got] == [p.max_tokens for p in MIXED]
    assert all(0 <= t < cuda.vocab_size for tokens in got for t in tokens)
    if name not in ("none", "prompt-lookup"):
        assert draft_tokens > 0  # the drafter really proposed on the cuda target


@pytest.mark.parametrize("name", ["eagle3-chain", "dspark-tree", "hybrid-merge"])
def test_seeded_sampling_on_cuda_replays(targets, draft_dirs, mixed_on_cuda, name):
    _, cuda = targets
    with fake_cuda():
        again = _run(cuda, draft_dirs, name, MIXED)
    assert [r.token_ids for r in again] == mixed_on_cuda(name)[0]


@pytest.mark.parametrize("name", ["dspark-tree", "corpus-tree"])
def test_the_verify_budget_on_cuda(targets, draft_dirs, greedy_reference, name):
    """The timed verification budget: survival on the host, the kept nodes' q on the device."""
    _, cuda = targets
    with fake_cuda():
        got = _run(cuda, draft_dirs, name, MIXED, verify_budget=True)
    _assert_greedy_rows_are_the_targets([r.token_ids for r in got], greedy_reference)


@pytest.mark.parametrize("name", ["eagle3-tree", "corpus-tree"])
def test_trees_on_a_cuda_target_without_tree_attention(targets, draft_dirs, greedy_reference, name, monkeypatch):
    """A target that cannot run tree attention verifies each tree's chain of first children (tree.first_children):
    the chain's tokens on the host, its q still on the device."""
    _, cuda = targets
    monkeypatch.setattr(cuda, "supports_tree_attention", False)
    with fake_cuda():
        got = _run(cuda, draft_dirs, name, MIXED)
    _assert_greedy_rows_are_the_targets([r.token_ids for r in got], greedy_reference)


def test_draft_sampling_hands_out_generators_of_the_draws_device():
    host = [torch.Generator().manual_seed(1), None]
    with fake_cuda():
        device = [torch.Generator(device="cuda").manual_seed(1), None]
        sampling = DraftSampling(torch.tensor([1.0, 0.0]), host, device)
        assert sampling.generators_on("cpu") is host and sampling.generators_on(CUDA) is device
        with pytest.raises(ValueError, match="generators live on cpu.*device_generators"):
            DraftSampling(torch.tensor([1.0, 0.0]), host).generators_on(CUDA)
