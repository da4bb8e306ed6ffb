"""Lossless speculation on the real default target (fp32): every drafter reproduces target-only greedy output.

20 prompts from the eval sets; the reference is target-only greedy decoding of all 20 in one batch (one weight
read per step instead of twenty: seconds instead of two minutes of fp32 on one core), tied to Hugging Face's
greedy decode on the three shortest prompts. The speculative runs use batches of 8 (so twelve requests join
mid-run), rows accept different numbers of drafts in the same verify pass, finish at different times, and slots are
compacted mid-run. The token cap per verify pass is lifted so every row gets the width its test names. Two tree
drafters go through tree attention and KV compaction: random trees, and prompt lookup's chain with a wrong sibling
listed before every right token, so every accepted path leaves the first children and its KV entries must move.
"""

import pytest
import torch

from deepspec.decoding import SamplingParams, SpecEngine, build_drafter
from deepspec.decoding.drafter import Drafter, Proposal
from deepspec.decoding.drafters.prompt_lookup import PromptLookupDrafter
from deepspec.decoding.drafters.random import RandomDrafter
from deepspec.decoding.planner import BudgetPlanner
from deepspec.decoding.verify_budget import StepTimeModel
from deepspec.paths import repo_root
from tests.conftest import eval_prompts

pytestmark = pytest.mark.slow
MAX_TOKENS = 32
BATCH = 8


@pytest.fixture(scope="module")
def prompt_ids(smollm2):
    prompts = eval_prompts("humaneval", 7) + eval_prompts("gsm8k", 7) + eval_prompts("mbpp", 6)
    return [smollm2.encode_chat([{"role": "user", "content": p}]) for p in prompts]


@pytest.fixture(scope="module")
def reference(smollm2, prompt_ids):
    engine = SpecEngine(smollm2, None, max_batch_size=len(prompt_ids), max_seq_len=1024)
    return [r.token_ids for r in engine.generate(prompt_ids, SamplingParams(max_tokens=MAX_TOKENS))]


class _Decoyed(Drafter):
    """A chain drafter's proposal as a tree: before each of its tokens, a sibling with a different token."""

    name = "decoyed"

    def __init__(self, inner: Drafter, vocab_size: int):
        self.inner, self.vocab_size = inner, vocab_size

    def propose(self, view, slots, k, sampling) -> Proposal:
        chain = self.inner.propose(view, slots, max(k // 2, 1), sampling).padded(max(k // 2, 1))
        B, n = chain.tokens.shape
        tokens = torch.stack([(chain.tokens + 1) % self.vocab_size, chain.tokens], dim=2).view(B, 2 * n)
        right = torch.arange(n) * 2 + 1  # node of the j-th chain token; its parent is the (j-1)-th one
        parents = torch.cat([torch.tensor([-1]), right[:-1]]).repeat_interleave(2).expand(B, 2 * n).clone()
        return Proposal.from_rows(tokens[:, :k], (2 * chain.num_tokens).clamp(max=k), parents=parents[:, :k])


def _drafter(name: str, target):
    if name == "prompt-lookup":
        return PromptLookupDrafter()
    if name == "random-tree":
        return RandomDrafter(target.vocab_size, seed=0, tree=True)
    if name == "lookup-tree":
        return _Decoyed(PromptLookupDrafter(), target.vocab_size)
    if name == "corpus-lookup":  # the shipped index of the target's own answers
        return build_drafter(str(repo_root() / "drafts" / "smollm2-135m-corpus"), target)
    return RandomDrafter(target.vocab_size, seed=0)


@pytest.mark.parametrize("drafter_name", ["prompt-lookup", "corpus-lookup", "random", "random-tree", "lookup-tree"])
def test_greedy_output_identical_with_any_drafter(smollm2, prompt_ids, reference, drafter_name):
    drafter = _drafter(drafter_name, smollm2)
    tree = drafter_name.endswith("-tree")
    # trees verified in full (no budget), so the shapes the drafter proposes are the shapes checked. Random drafts
    # are nearly all rejected, every step alike: a short chain and a 6-node tree over the first half of each answer
    # reach every rejection path at a third of the compute
    randomized = drafter_name.startswith("random")
    width = {"random": 3, "random-tree": 6}.get(drafter_name, 10 if tree else 5)
    max_tokens = MAX_TOKENS // 2 if randomized else MAX_TOKENS
    engine = SpecEngine(
        smollm2,
        drafter,
        max_batch_size=BATCH,
        max_seq_len=1024,
        num_speculative_tokens=width,
        max_verify_tokens=BATCH * (width + 1),
        planner=None if tree else BudgetPlanner(),
    )
    if engine.planner.step_time is not None:
        # the budget's code path, on a fixed, nearly flat step curve: the probe's timings on cores shared with the
        # rest of the suite can make every draft look too dear, and then no draft is ever verified
        engine.planner.step_time = StepTimeModel([(1, 0.010), (BATCH * (width + 1), 0.012)])
    results = engine.generate(prompt_ids, SamplingParams(max_tokens=max_tokens))
    mismatched = [i for i, (r, ref) in enumerate(zip(results, reference)) if r.token_ids != ref[:max_tokens]]
    assert not mismatched, f"prompts {mismatched} differ from target-only greedy"
    if not randomized:
        assert sum(r.num_accepted_tokens for r in results) > 0


def test_the_reference_is_hugging_face_greedy(smollm2, prompt_ids, reference):
    """Hugging Face's own forward scores each reference answer in one pass (teacher forcing): its argmax at every
    position is the next reference token, and an EOS where the reference stopped early. That is the greedy decode
    HF's `generate` produces, checked in one forward per prompt instead of one per token."""
    hf = smollm2.hf_model()
    shortest = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))[:3]
    for ids, ref in [(prompt_ids[i], reference[i]) for i in shortest]:
        with torch.no_grad():
            logits = hf(torch.tensor([ids + ref]), logits_to_keep=len(ref) + 1).logits[0]
        predicted = logits.argmax(-1).tolist()
        assert predicted[: len(ref)] == ref
        assert len(ref) == MAX_TOKENS or predicted[len(ref)] in smollm2.eos_token_ids


def test_stop_string_on_real_text(smollm2, prompt_ids, reference):
    full = smollm2.decode(reference[0])
    assert "\n" in full
    engine = SpecEngine(smollm2, PromptLookupDrafter(), max_batch_size=1, max_seq_len=1024)
    result = engine.generate([prompt_ids[0]], SamplingParams(max_tokens=MAX_TOKENS, stop=("\n",)))[0]
    assert result.finish_reason == "stop" and result.text == full[: full.index("\n")]
