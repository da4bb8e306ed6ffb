"""Prompt lookup: the continuation of the latest earlier n-gram match, read from the engine's batch state through
a DraftDriver; its per-sequence n-gram indexes follow sequences (not slots) and never cross batch states."""

import torch

from deepspec.decoding.draft_driver import DraftDriver
from deepspec.decoding.drafter import DraftSampling
from deepspec.decoding.drafters.prompt_lookup import PromptLookupDrafter
from tests.deepspec.decoding.checked import drafter_of

GREEDY = DraftSampling(torch.zeros(1), [None])


def _driver_with(tokens, drafter=None) -> DraftDriver:
    """A driver whose slot 0 holds `tokens` (prompt + first token), as the engine's batch state would."""
    driver = DraftDriver(drafter or PromptLookupDrafter(min_ngram=2, max_ngram=3), num_slots=8, max_tokens=64)
    driver.start(0, tokens)
    return driver


def _drafted(p, row: int = 0) -> list[int]:
    return p.tokens[row, : int(p.num_tokens[row])].tolist()


def test_proposes_continuation_of_latest_earlier_match():
    d = _driver_with([1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 1, 2, 3])
    p = d.propose([0], 3, GREEDY)
    assert p.tokens[0].tolist() == [7, 8, 1] and p.num_tokens.tolist() == [3]


def test_no_match_proposes_nothing():
    d = _driver_with([1, 2, 3, 4])
    assert d.propose([0], 4, GREEDY).num_tokens.tolist() == [0]


def test_batch_state_move_keeps_the_proposal():
    """The engine compacts its slots (BatchState.move); the drafter hears nothing, yet the moved sequence drafts
    what it drafted before the move, from the index it already built (keyed by sequence, not slot)."""
    d = _driver_with([1, 2, 3, 1, 2])
    before = d.propose([0], 2, GREEDY)
    assert before.tokens[0].tolist() == [3, 1]
    d.move(0, 5)
    after = d.propose([5], 2, GREEDY)
    assert after.tokens[0].tolist() == before.tokens[0].tolist() and after.num_tokens.tolist() == [2]
    assert list(drafter_of(d.drafter, PromptLookupDrafter)._indexes) == [
        d.view.sequence_id(5)
    ]  # the same index, not a rebuilt one


def test_a_drafter_shared_by_two_batch_states_keeps_their_sequences_apart():
    """Two drivers (two engines) share one drafter; both sequences sit in slot 0 at the same length, so an index
    keyed by slot would hand B the positions of A's n-grams (B's "1 2" would draft [2, 7]). Every proposal equals
    a fresh drafter's for the same tokens, also after more tokens are committed on each side in turn."""
    shared = PromptLookupDrafter(min_ngram=2, max_ngram=3)
    history = {"a": [1, 2, 3, 4, 5, 6, 1, 2], "b": [5, 1, 2, 7, 8, 9, 1, 2]}
    drivers = {name: _driver_with(tokens, shared) for name, tokens in history.items()}

    def check(name: str) -> list[int]:
        drafted = _drafted(drivers[name].propose([0], 2, GREEDY))
        assert drafted == _drafted(_driver_with(history[name]).propose([0], 2, GREEDY)), name
        return drafted

    assert check("a") == [3, 4] and check("b") == [7, 8]
    for name, more in (("a", [3]), ("b", [7]), ("a", [4, 5]), ("b", [8])):
        drivers[name].commit([0], [more])
        history[name] += more
        check(name)
        check("b" if name == "a" else "a")


def test_indexes_of_sequences_gone_from_the_view_are_dropped_when_a_new_one_arrives():
    """Per-sequence indexes do not outlive their sequences: once a sequence has left the batch state, the next new
    sequence's first proposal drops its index, and the live ones keep theirs."""
    d = _driver_with([1, 2, 3, 1, 2])
    d.start(1, [4, 5, 6, 4, 5])
    d.propose([0, 1], 2, DraftSampling(torch.zeros(2), [None, None]))
    assert len(drafter_of(d.drafter, PromptLookupDrafter)._indexes) == 2
    d.release(1)
    d.start(1, [7, 8, 9, 7, 8])
    assert _drafted(d.propose([1], 2, GREEDY)) == [9, 7]
    assert set(drafter_of(d.drafter, PromptLookupDrafter)._indexes) == {d.view.sequence_id(0), d.view.sequence_id(1)}
    d.release(0)
    d.release(1)
    d.start(0, [3, 3, 3])
    assert _drafted(d.propose([0], 2, GREEDY)) == [3]
    assert len(drafter_of(d.drafter, PromptLookupDrafter)._indexes) == 1
