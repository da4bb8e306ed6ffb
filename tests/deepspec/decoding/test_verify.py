"""deepspec.decoding.verify: the engine's verification step on top of the plugins ops."""

import torch

from deepspec.decoding.params import SamplingParams
from deepspec.decoding.verify import RowSampling, sample_next, verify


def test_all_greedy_rows_accept_the_longest_matching_prefix():
    drafts = torch.tensor([[5, 6, 7], [5, 9, 7], [1, 2, 3]])
    logits = torch.zeros(3, 4, 10).scatter_(2, torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8], [4, 2, 3, 8]])[..., None], 1.0)
    num, nxt = verify(drafts, torch.tensor([3, 3, 3]), logits, None, None)
    assert num.tolist() == [3, 1, 0] and nxt.tolist() == [8, 6, 4]


def test_padding_past_the_draft_count_may_hold_any_value():
    logits = torch.zeros(1, 4, 10).scatter_(2, torch.tensor([[5, 6, 7, 8]])[..., None], 1.0)
    num, nxt = verify(torch.tensor([[5, 6, -1]]), torch.tensor([2]), logits, None, None)
    assert num.tolist() == [2] and nxt.tolist() == [7]


def test_mixed_batches_keep_greedy_rows_exact_and_seeded_rows_reproducible():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 4, 50, generator=g)
    drafts = logits[:, :3].argmax(-1)
    params = [SamplingParams(), SamplingParams(temperature=1.0, top_p=0.9, seed=1), SamplingParams(temperature=0.7)]

    def run():
        gens: list[torch.Generator | None] = [torch.Generator().manual_seed(7) for _ in params]
        return verify(drafts, torch.tensor([3, 3, 3]), logits, None, RowSampling.draw(params, gens))

    (num, nxt), (num2, nxt2) = run(), run()
    assert num[0] == 3 and nxt[0] == logits[0, 3].argmax()
    assert num.tolist() == num2.tolist() and nxt.tolist() == nxt2.tolist()


def test_sample_next_draws_only_tokens_the_filter_keeps():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).expand(64, 4)
    params = [SamplingParams(temperature=1.0, top_k=2)] * 64
    gens: list[torch.Generator | None] = [torch.Generator().manual_seed(i) for i in range(64)]
    tokens = sample_next(logits, RowSampling.draw(params, gens))
    assert set(tokens.tolist()) == {0, 1}
