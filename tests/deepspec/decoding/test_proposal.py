"""The ragged proposal drafters return (deepspec/decoding/drafter.py, after vLLM's spec-decode metadata: flat draft
tokens and cumulative counts, draft probabilities for the proposed tokens only) and the padded form the engine's
batched ops take: the two convert both ways without loss, and without a copy where every row is full."""

from __future__ import annotations

import pytest
import torch

from deepspec.decoding.draft_driver import DraftDriver
from deepspec.decoding.drafter import PaddedProposal, Proposal
from deepspec.decoding.drafters.prompt_lookup import PromptLookupDrafter
from deepspec.decoding.drafters.random import RandomDrafter
from tests.deepspec.decoding.checked import parents_of, probs_of


def _padded(num: list[int], k: int = 4, vocab: int = 6, tree: bool = False) -> PaddedProposal:
    B = len(num)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(vocab, (B, k), generator=g)
    parents = torch.tensor([[-1, 0, 0, 1][:k]] * B) if tree else None
    return PaddedProposal(
        tokens, torch.tensor(num), torch.rand(B, k, vocab, generator=g), torch.rand(B, k, generator=g), parents
    )


def test_ragged_rows_hold_each_rows_nodes_only_and_pad_back_exactly():
    padded = _padded([2, 0, 4], tree=True)
    ragged = padded.ragged()
    assert ragged.cu_num_tokens.tolist() == [0, 2, 2, 6] and ragged.num_tokens.tolist() == [2, 0, 4]
    assert ragged.tokens.tolist() == padded.tokens[0, :2].tolist() + padded.tokens[2].tolist()
    assert probs_of(ragged).shape == (6, 6)  # distributions for the six proposed tokens, none for padding
    torch.testing.assert_close(probs_of(ragged)[2:], probs_of(padded)[2])
    back = ragged.padded(4)
    live = torch.arange(4)[None, :] < back.num_tokens[:, None]
    for field in ("tokens", "survival", "parents"):
        torch.testing.assert_close(getattr(back, field)[live], getattr(padded, field)[live])
    torch.testing.assert_close(probs_of(back)[live], probs_of(padded)[live])
    assert (
        (probs_of(back)[~live] == 0).all() and (parents_of(back)[~live] == -1).all() and (back.tokens[~live] == 0).all()
    )


@pytest.mark.parametrize("num", [[4, 4, 4], [3]])
def test_full_rows_and_single_rows_convert_as_views(num):
    """A neural chain drafts alike in every row: no copy of its [B, k, V] probabilities either way."""
    padded = _padded(num)
    ragged = padded.ragged()
    assert probs_of(ragged).data_ptr() == probs_of(padded).data_ptr()
    assert ragged.tokens.data_ptr() == padded.tokens.data_ptr()
    if num == [4, 4, 4]:
        assert probs_of(ragged.padded(4)).data_ptr() == probs_of(padded).data_ptr()


def test_a_row_longer_than_the_width_is_refused():
    ragged = _padded([4, 1]).ragged()
    with pytest.raises(ValueError, match="does not fit 3 columns"):
        ragged.padded(3)
    assert ragged.padded().tokens.shape == (2, 4)  # default width: the longest row


def test_an_empty_round_is_zero_wide():
    ragged = Proposal(torch.zeros(0, dtype=torch.long), torch.zeros(3, dtype=torch.long))
    padded = ragged.padded(2)
    assert padded.tokens.shape == (2, 2) and padded.num_tokens.tolist() == [0, 0]
    assert not ragged.is_tree and padded.probs is None


def test_prompt_lookup_proposes_ragged_rows():
    driver = DraftDriver(PromptLookupDrafter())
    driver.start(0, [1, 2, 3, 1, 2])  # "1 2" occurred before: proposes what followed it
    driver.start(1, [7, 8, 9])  # no repeat: proposes nothing
    ragged = driver.propose_ragged([0, 1], 4)
    assert ragged.cu_num_tokens.tolist() == [0, 3, 3] and ragged.tokens.tolist() == [3, 1, 2]
    assert ragged.probs is None and not ragged.is_tree


def test_a_sampled_tree_carries_q_for_its_nodes_only():
    driver = DraftDriver(RandomDrafter(8, seed=1, sample_probs=True, tree=True))
    for slot in range(3):
        driver.start(slot, [1, 2])
    ragged = driver.propose_ragged([0, 1, 2], 5)
    n = int(ragged.cu_num_tokens[-1])
    assert ragged.tokens.shape == (n,) and parents_of(ragged).shape == (n,) and probs_of(ragged).shape == (n, 8)
    for b in range(3):  # parents stay within their row, before the node
        a, e = ragged.cu_num_tokens[b], ragged.cu_num_tokens[b + 1]
        assert all(-1 <= int(p) < i for i, p in enumerate(parents_of(ragged)[a:e].tolist()))
