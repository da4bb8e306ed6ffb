import torch

from deepspec.decoding.verify import greedy_verify, rejection_verify_row


def test_greedy_accepts_longest_matching_prefix_per_row():
    drafts = torch.tensor([[5, 6, 7], [5, 9, 7], [1, 2, 3]])
    argmax = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8], [4, 2, 3, 8]])
    assert greedy_verify(drafts, torch.tensor([3, 3, 3]), argmax).tolist() == [3, 1, 0]


def test_greedy_ignores_padding_past_num_drafts():
    drafts = torch.tensor([[5, 6, 7]])
    argmax = torch.tensor([[5, 6, 7, 8]])
    assert greedy_verify(drafts, torch.tensor([2]), argmax).tolist() == [2]


def test_rejection_accepts_draft_that_target_prefers_with_certainty():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    q = torch.tensor([[0.5, 0.5, 0.0]])
    assert rejection_verify_row([1], p, q, torch.Generator().manual_seed(0)) == (1, 2)


def test_rejection_resamples_from_residual():
    # the target never emits token 0: a draft of 0 is always rejected and the recovered token is never 0
    p = torch.tensor([[0.0, 0.3, 0.7], [1 / 3, 1 / 3, 1 / 3]])
    for seed in range(20):
        n, token = rejection_verify_row([0], p, None, torch.Generator().manual_seed(seed))
        assert n == 0 and token in (1, 2)
