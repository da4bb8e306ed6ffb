"""bench.session_replay's conversations (the run itself is the benchmark)."""

import pytest

from bench.session_replay import RETRY, conversations


def test_each_kind_of_later_turn_asks_the_first_turns_task_again():
    for kind in ("retry", "rewrite", "repeat"):
        convs = conversations(2, 3, kind)
        assert [len(turns) for turns in convs] == [3, 3]
        assert all(turn.startswith(turns[0]) for turns in convs for turn in turns)
    repeat, retry = conversations(1, 3, "repeat")[0], conversations(1, 3, "retry")[0]
    assert repeat == [repeat[0]] * 3  # the same request, unchanged
    assert retry[2].endswith(RETRY.format(turn=2))


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="kind must be one of"):
        conversations(1, 2, "replay")
