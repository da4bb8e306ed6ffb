"""Structured outputs under speculation (deepspec/decoding/structured.py): drafts the grammar forbids never reach the
verify pass, greedy output is identical with and without a draft, and sampled output is exactly the constrained
target distribution (chi-square, with a negative control that skips the draft's renormalisation).

vLLM applies the grammar bitmask to the logits before its sampler (vllm/v1/worker/gpu_model_runner.py,
`apply_grammar_bitmask`), so temperature and top-p act on the constrained distribution and its logprobs are read
after the mask; the engine does the same."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from scipy.stats import chisquare

import deepspec.decoding.grammar_walks as grammar_walks
from deepspec.decoding.drafter import Drafter, DraftSampling, Proposal
from deepspec.decoding.drafters.prompt_lookup import PromptLookupDrafter
from deepspec.decoding.drafters.random import RandomDrafter
from deepspec.decoding.engine import SpecEngine
from deepspec.decoding.params import SamplingParams
from deepspec.decoding.structured import StructuredOutput
from deepspec.decoding.validation import RequestError, RequestErrorCode
from tests.training.helpers import tiny_target

#: the tiny targets' token i is the character chr(33 + i)
CODE = StructuredOutput("regex", "(A|B|C)(D|E)[0-9]{3}")


def _char(c: str) -> int:
    return ord(c) - 33


@pytest.fixture(scope="module")
def target():
    return tiny_target(vocab_size=96)  # '!' .. '\x80': letters, digits, braces and quotes


class SkewedDrafter(Drafter):
    """Drafts sampled from a fixed q with half its mass on a token the grammar forbids ('Z') and the rest far from
    the target's: the cut path and the renormalisation of q both matter. tree=True proposes two root children and
    one child under each, siblings drawn from the one q."""

    name = "skewed"

    def __init__(self, vocab_size: int, mass: dict[str, float], tree: bool = False, seed: int = 0):
        self.q = torch.zeros(vocab_size)
        for c, p in mass.items():
            self.q[_char(c)] = p
        self.tree = tree
        self.generator = torch.Generator().manual_seed(seed)

    def propose(self, view, slots: list[int], k: int, sampling: DraftSampling) -> Proposal:
        B, k = len(slots), min(k, 4) if self.tree else k
        tokens = torch.multinomial(self.q.expand(B * k, -1), 1, generator=self.generator).view(B, k)
        probs = self.q.expand(B, k, -1).clone()
        parents = torch.tensor([-1, -1, 0, 1][:k]).expand(B, k).clone() if self.tree else None
        return Proposal.from_rows(tokens, torch.full((B,), k), probs, parents=parents)


def _engine(target, drafter, batch=8):
    return SpecEngine(target, drafter, max_batch_size=batch, max_seq_len=64, num_speculative_tokens=4)


DRAFTERS = {
    "none": lambda t: None,
    "prompt-lookup": lambda t: PromptLookupDrafter(),
    "random chain": lambda t: RandomDrafter(t.vocab_size, sample_probs=True),
    "random tree": lambda t: RandomDrafter(t.vocab_size, sample_probs=True, tree=True),
    "skewed chain": lambda t: SkewedDrafter(t.vocab_size, {"Z": 0.5, "A": 0.2, "D": 0.2, "7": 0.1}),
    "skewed tree": lambda t: SkewedDrafter(t.vocab_size, {"Z": 0.5, "A": 0.2, "D": 0.2, "7": 0.1}, tree=True),
}
PROMPTS = [[1, 2, 3], [4, 5, 6, 4, 5, 6], [7]]


@pytest.fixture(scope="module")
def greedy_without_a_draft(target):
    return [
        r.token_ids for r in _engine(target, None).generate(PROMPTS, SamplingParams(max_tokens=12, structured=CODE))
    ]


@pytest.mark.parametrize("name", DRAFTERS)
def test_greedy_constrained_output_is_identical_with_and_without_a_draft(target, greedy_without_a_draft, name):
    got = _engine(target, DRAFTERS[name](target)).generate(PROMPTS, SamplingParams(max_tokens=12, structured=CODE))
    assert [r.token_ids for r in got] == greedy_without_a_draft
    assert all(re.fullmatch("(A|B|C)(D|E)[0-9]{3}", r.text) and r.finish_reason == "stop" for r in got)


@pytest.mark.parametrize("name", ["random chain", "random tree", "skewed chain", "skewed tree"])
def test_sampled_constrained_output_matches_and_forbidden_drafts_are_cut(target, name):
    params = [SamplingParams(max_tokens=12, temperature=1.0, seed=s, structured=CODE) for s in range(6)]
    got = _engine(target, DRAFTERS[name](target)).generate([PROMPTS[0]] * 6, params)
    assert all(re.fullmatch("(A|B|C)(D|E)[0-9]{3}", r.text) for r in got), [r.text for r in got]
    # verified drafts are only tokens the grammar allowed: the 5 characters of the code, and the skewed drafter's
    # 'Z' (half its mass) is always cut
    assert all(r.num_accepted_tokens <= 5 for r in got) and sum(r.num_draft_tokens for r in got) > 0


# ---- exactness: the constrained target distribution, sampled through drafts ------------------------------------
#: the first character comes from the prefill; the draft meets the second and the third
GROUPS = ("ABC", "DE", "FG")
THREE = StructuredOutput("regex", "".join(f"({'|'.join(g)})" for g in GROUPS))
OUTCOMES = [a + b + c for a in GROUPS[0] for b in GROUPS[1] for c in GROUPS[2]]
#: half the mass on 'Z' (never allowed), the rest on allowed and forbidden characters, far from the target's
SKEWED = {"Z": 0.5, "D": 0.3, "E": 0.05, "F": 0.15}


def _constrained_distribution(target, prompt: list[int]) -> list[float]:
    """P(outcome) under the target at temperature 1 with every position masked to the grammar, from its logits."""

    def allowed_probs(text: str) -> dict[str, float]:
        """Each character the grammar allows after `text` → its probability, renormalised over those characters."""
        ids = prompt + [_char(c) for c in text]
        logits = target.forward(torch.tensor([ids]), torch.zeros(1, dtype=torch.long), logits="last").logits[0, -1]
        allowed = torch.tensor([_char(c) for c in GROUPS[len(text)]])
        return dict(zip(GROUPS[len(text)], torch.softmax(logits.double()[allowed], -1).tolist()))

    def p(outcome: str) -> float:
        return math.prod(allowed_probs(outcome[:i])[outcome[i]] for i in range(3))

    return [p(o) for o in OUTCOMES]


def _sample_counts(target, drafter, n: int, prompt: list[int]) -> list[int]:
    # batch 8: the step's 32 verify tokens leave each row room for 3 drafts
    engine = _engine(target, drafter, batch=8)
    counts = dict.fromkeys(OUTCOMES, 0)
    accepted = 0
    for start in range(0, n, 8):
        params = [
            SamplingParams(max_tokens=5, temperature=1.0, seed=1000 + s, structured=THREE)
            for s in range(start, min(start + 8, n))
        ]
        for r in engine.generate([prompt] * len(params), params):
            counts[r.text] += 1
            accepted += r.num_accepted_tokens
    assert accepted > n // 10  # drafts were verified and accepted, not only cut
    return [counts[o] for o in OUTCOMES]


@pytest.fixture(scope="module")
def flat_target():
    return tiny_target(vocab_size=96, temperature=1.0)  # a flat distribution: drafts are often rejected


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_sampling_through_drafts_is_exactly_the_constrained_distribution(flat_target, tree):
    prompt = [10, 20, 30]
    expected = _constrained_distribution(flat_target, prompt)
    n = 960
    counts = _sample_counts(flat_target, SkewedDrafter(96, SKEWED, tree=tree), n, prompt)
    assert chisquare(counts, [p * n for p in expected]).pvalue > 1e-3, (counts, expected)


def test_negative_control_verifying_with_the_raw_draft_q_skews_the_output(flat_target, monkeypatch):
    """The chi-square above can fail: keep the cut but verify with the draft's raw q instead of its restriction
    to the allowed tokens, and the output leaves the constrained distribution."""
    monkeypatch.setattr(grammar_walks, "restrict_draft_probs", lambda q, bitmask: q)
    prompt = [10, 20, 30]
    expected = _constrained_distribution(flat_target, prompt)
    n = 960
    counts = _sample_counts(flat_target, SkewedDrafter(96, SKEWED), n, prompt)
    assert chisquare(counts, [p * n for p in expected]).pvalue < 1e-6, (counts, expected)


# ---- kinds and refusals ------------------------------------------------------------------------------------------
def test_json_schema_and_choice_constrain_the_output(target):
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    engine = _engine(target, RandomDrafter(target.vocab_size, sample_probs=True))
    constraint = StructuredOutput("json_schema", json.dumps(schema))
    out = engine.generate([PROMPTS[0]], SamplingParams(max_tokens=40, structured=constraint))[0]
    assert out.finish_reason == "stop" and isinstance(json.loads(out.text)["ok"], bool), out.text
    picks = engine.generate(
        [PROMPTS[1]] * 3,
        [
            SamplingParams(max_tokens=8, temperature=1.0, seed=s, structured=StructuredOutput.choice(["yes", "no"]))
            for s in range(3)
        ],
    )
    assert all(r.text in ("yes", "no") for r in picks)


@pytest.mark.parametrize(
    "constraint, message",
    [
        (("regex", "(unclosed"), "invalid regex"),
        (("json_schema", "{not json"), "invalid json_schema"),
        (("grammar", "root ::= undefined_rule"), "invalid grammar"),
        (("choice", "[]"), "non-empty list"),
    ],
)
def test_a_constraint_that_does_not_compile_is_refused_with_its_code(target, constraint, message):
    engine = _engine(target, None)
    params = SamplingParams(max_tokens=4, structured=StructuredOutput(*constraint))
    with pytest.raises(RequestError, match=message) as info:
        engine.add_request("r", [1, 2], params)
    assert info.value.code is RequestErrorCode.STRUCTURED_OUTPUT_INVALID
    assert engine.num_running == 0  # nothing was queued; the engine still serves
    assert engine.generate([[1, 2]], SamplingParams(max_tokens=3))[0].token_ids


def test_an_unknown_kind_or_a_missing_spec_is_refused():
    with pytest.raises(RequestError, match="one of json_object, json_schema"):
        StructuredOutput("yaml", "x")
    with pytest.raises(RequestError, match="needs its spec"):
        StructuredOutput("regex")


def test_a_constraint_no_token_can_start_is_refused(target):
    """An empty language (or a first character no token spells) would leave no token allowed: refused up front."""
    engine = _engine(target, None)
    for constraint in (StructuredOutput("regex", "[^\\x00-\\U0010FFFF]"), StructuredOutput.choice(["\u00e9"])):
        with pytest.raises(RequestError, match="admits no output") as info:
            engine.add_request("r", [1, 2], SamplingParams(max_tokens=4, structured=constraint))
        assert info.value.code is RequestErrorCode.STRUCTURED_OUTPUT_INVALID


@pytest.mark.parametrize("name", ["none", "random chain", "skewed tree"])
def test_a_dead_end_mid_output_ends_that_request_alone(target, name):
    """'A' can start the choice, but no token of this vocabulary spells the 'é' after it: the request ends with
    finish reason "abort" after 'A', and the request beside it in the batch is untouched."""
    engine = _engine(target, DRAFTERS[name](target))
    dead, fine = engine.generate(
        [PROMPTS[0], PROMPTS[1]],
        [
            SamplingParams(max_tokens=6, temperature=1.0, seed=3, structured=StructuredOutput.choice(["A\u00e9"])),
            SamplingParams(max_tokens=12, structured=CODE),
        ],
    )
    assert (dead.text, dead.finish_reason) == ("A", "abort")
    assert re.fullmatch("(A|B|C)(D|E)[0-9]{3}", fine.text) and fine.finish_reason == "stop"
