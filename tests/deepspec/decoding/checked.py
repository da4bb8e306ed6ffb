"""What a test knows of an object that the declared types leave open, checked where the test reads it: a drafter
built from a directory is the concrete kind the directory names (build_drafter declares only Drafter | None), a
tree proposal carries the parents, probs and survival that a chain may leave out, and a request that asked for
logprobs gets them."""

from __future__ import annotations

from typing import TypeVar

import torch

from deepspec.decoding.drafter import PaddedProposal, Proposal
from deepspec.decoding.params import GenerationResult, TokenLogprob

DrafterKind = TypeVar("DrafterKind")


def drafter_of(drafter: object, kind: type[DrafterKind]) -> DrafterKind:
    """`drafter`, checked to be a `kind`."""
    assert isinstance(drafter, kind), f"expected a {kind.__name__}, got {type(drafter).__name__}"
    return drafter


def parents_of(proposal: Proposal | PaddedProposal) -> torch.Tensor:
    """The tree's parent index per node [B, W] (padded) or [total] (ragged)."""
    assert proposal.parents is not None, "a chain proposal: no parents"
    return proposal.parents


def probs_of(proposal: Proposal | PaddedProposal) -> torch.Tensor:
    """The draft distribution each token was drawn from (a sampled proposal has them)."""
    assert proposal.probs is not None, "a greedy proposal: no draft probabilities"
    return proposal.probs


def survival_of(proposal: Proposal | PaddedProposal) -> torch.Tensor:
    """Each token's estimated survival (a drafter with acceptance tables gives it)."""
    assert proposal.survival is not None, "no survival estimate"
    return proposal.survival


def logprobs_of(result: GenerationResult) -> list[TokenLogprob]:
    """The logprobs of each generated token (the request asked for them)."""
    assert result.logprobs is not None, "no logprobs: the request did not ask for them"
    return result.logprobs


def prompt_scores(result: GenerationResult) -> list[TokenLogprob]:
    """The prompt logprobs of every prompt position past the first, which has nothing before it to be scored by."""
    scores = result.prompt_logprobs
    assert scores is not None, "no prompt logprobs: the request did not ask for them"
    assert scores[0] is None, "the first prompt token was scored"
    scored = [lp for lp in scores[1:] if lp is not None]
    assert len(scored) == len(scores) - 1, "a prompt position past the first went unscored"
    return scored
