"""Device-to-host reads per engine round on a CUDA target: what CUDA graphs and `torch.compile` cannot cross, and
what stalls the launch queue on a GPU. From the proposal to the committed tokens a chain round reads the device
once (how many drafts each row accepted, its next token and its drafts, in one tensor); DSpark's chain reads once
more, its slots' survival, which the verification budget needs on the host to size the verify pass.

A neural token tree (Eagle3, DFlash, DSpark with `tree_branches`) grows on the device and its drafter reads it back
once, when it is done (tokens, parents, node count and survival in one tensor; neural.grow_tree): at most one
drafter read a round, whatever the depth. The tree round has at most two in all: that one and the engine's one
(each row's accepted count, next token and path in one tensor after verify_tree); the decoder checks the tree's
parents on the host copy the engine hands it, before moving them to the device.

The target runs on the fake CUDA device of tests/deepspec/decoding/fake_cuda.py, so every tensor the target or a
neural draft makes says `cuda`. A TorchFunctionMode counts the reads of such tensors (`.item()`, `.tolist()`,
`.cpu()`, `.numpy()`, `int()` / `float()` / `bool()` of one, `.to("cpu")`), and FakeCudaTensor's own `tolist`
(which reads its values without a torch function) is counted too.
"""

from __future__ import annotations

import collections
import traceback

import pytest
import torch
from torch.overrides import TorchFunctionMode

from deepspec.decoding.drafters.prompt_lookup import PromptLookupDrafter
from deepspec.decoding.engine import SpecEngine
from deepspec.decoding.params import SamplingParams
from deepspec.decoding.registry import load_checkpoint_drafter
from deepspec.models import pytorch_decoder
from deepspec.models.drafts import save_draft
from tests.deepspec.decoding import fake_cuda as fake
from tests.training.helpers import tiny_draft, tiny_target

PROMPTS = [[1, 2, 3, 1, 2, 3, 4], [5, 6, 7, 5, 6, 7], [8, 9, 10, 11]]
#: device reads one round may make, per drafter (the module docstring says why DSpark's is two)
ALLOWED = {"none": 1, "prompt-lookup": 1, "eagle3": 1, "dflash": 1, "dspark": 2}
#: device reads one tree round may make in all, and those of them the drafter makes (the module docstring says why)
ALLOWED_TREE, ALLOWED_TREE_DRAFTER = 2, 1
_READS = {"item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__"}


class DeviceReads(TorchFunctionMode):
    """Counts reads of cuda tensors, by (what, where in the repo)."""

    def __init__(self):
        super().__init__()
        self.reads: collections.Counter = collections.Counter()
        #: the reads made in a drafter's own code (deepspec/decoding/drafters/)
        self.drafter_reads = 0

    def record(self, what: str) -> None:
        frames = [f for f in traceback.extract_stack()[:-2] if "/deepspec/" in f.filename]
        self.drafter_reads += bool(frames) and "/deepspec/decoding/drafters/" in frames[-1].filename
        self.reads[(what, f"{frames[-1].filename.rsplit('/', 3)[-1]}:{frames[-1].lineno}" if frames else "?")] += 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        tensor = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if tensor is not None and tensor.device.type == "cuda":
            to_cpu = name == "to" and any(
                isinstance(a, (str, torch.device)) and torch.device(a).type == "cpu" for a in args[1:]
            )
            if name in _READS or to_cpu:
                self.record(name)
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def targets():
    cpu, cuda = tiny_target(), tiny_target()
    with fake.fake_cuda():
        pytorch_decoder(cuda).to("cuda")
    return cpu, cuda


@pytest.fixture(scope="module")
def draft_dirs(targets, tmp_path_factory):
    cpu, _ = targets
    root = tmp_path_factory.mktemp("drafts")
    return {
        algo: save_draft(tiny_draft(cpu, algo, draft_vocab_size=48), root / algo)
        for algo in ("eagle3", "dflash", "dspark")
    }


def _drafter(name, dirs, target):
    if name == "none":
        return None
    if name == "prompt-lookup":
        return PromptLookupDrafter()
    return load_checkpoint_drafter(dirs[name], target)


def _count_rounds(engine, counter, monkeypatch, temperature, rounds=4) -> int:
    """Start PROMPTS, run the prefill step uncounted, then count `rounds` decode rounds' reads; → rounds run."""
    fake_tolist = fake.FakeCudaTensor.tolist

    def counted_tolist(self):
        counter.record("tolist")
        return fake_tolist(self)

    for i, prompt in enumerate(PROMPTS):
        engine.add_request(
            f"r{i}", prompt, SamplingParams(max_tokens=30, temperature=temperature, seed=i, ignore_eos=True)
        )
    engine.step()  # the prefill step (its reads are the prompt's, once per request)
    monkeypatch.setattr(fake.FakeCudaTensor, "tolist", counted_tolist)
    with counter:
        for _ in range(rounds):
            engine.step()
    monkeypatch.setattr(fake.FakeCudaTensor, "tolist", fake_tolist)
    assert engine.has_unfinished(), "the rounds counted must all be decode rounds of running requests"
    return rounds


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("name", list(ALLOWED))
def test_a_chain_round_reads_the_device_once(targets, draft_dirs, monkeypatch, name, temperature):
    _, cuda = targets
    counter = DeviceReads()
    with fake.fake_cuda():
        engine = SpecEngine(
            cuda, _drafter(name, draft_dirs, cuda), max_batch_size=4, max_seq_len=128, num_speculative_tokens=3
        )
        rounds = _count_rounds(engine, counter, monkeypatch, temperature)
    per_round = sum(counter.reads.values()) / rounds
    assert per_round <= ALLOWED[name], dict(counter.reads)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("name", ["eagle3", "dflash", "dspark"])
def test_a_neural_tree_round_reads_the_device_a_bounded_number_of_times(
    targets, draft_dirs, monkeypatch, name, temperature
):
    """Trees of 2 branches, 6 nodes deep enough for several depths; no budget, so every round verifies its tree
    (the budget would cut an untrained draft's unlikely nodes and skip tree attention)."""
    _, cuda = targets
    counter = DeviceReads()
    with fake.fake_cuda():
        drafter = load_checkpoint_drafter(draft_dirs[name], cuda, tree_branches=2)
        proposals = []
        propose = drafter.propose
        monkeypatch.setattr(drafter, "propose", lambda *args: proposals.append(propose(*args)) or proposals[-1])
        engine = SpecEngine(cuda, drafter, max_batch_size=4, max_seq_len=128, num_speculative_tokens=6)
        rounds = _count_rounds(engine, counter, monkeypatch, temperature)
    assert all(p.is_tree and int(p.num_tokens.max()) > 1 for p in proposals[-rounds:])  # a tree every round
    assert counter.drafter_reads / rounds <= ALLOWED_TREE_DRAFTER, dict(counter.reads)
    assert sum(counter.reads.values()) / rounds <= ALLOWED_TREE, dict(counter.reads)
