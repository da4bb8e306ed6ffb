import torch

from deepspec.decoding.drafter import DraftSampling
from deepspec.decoding.drafters.prompt_lookup import PromptLookupDrafter

GREEDY = DraftSampling(torch.zeros(1), [None])


def _drafter_with(tokens):
    d = PromptLookupDrafter(min_ngram=2, max_ngram=3)
    d.reset(0, tokens[0])
    d.extend([0], torch.tensor([tokens[1:]]), torch.tensor([len(tokens) - 1]), None)
    return d


def test_proposes_continuation_of_latest_earlier_match():
    d = _drafter_with([1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 1, 2, 3])
    p = d.propose([0], 3, GREEDY)
    assert p.tokens[0].tolist() == [7, 8, 1] and p.num_tokens.tolist() == [3]


def test_no_match_proposes_nothing():
    d = _drafter_with([1, 2, 3, 4])
    assert d.propose([0], 4, GREEDY).num_tokens.tolist() == [0]


def test_move_slot_keeps_history():
    d = _drafter_with([1, 2, 3, 1, 2])
    d.move_slot(0, 5)
    assert d.propose([5], 2, GREEDY).tokens[0].tolist() == [3, 1]
