"""bench.session_affinity: the per-mode arithmetic over the turns it replayed (the run itself is the benchmark)."""

import pytest

from bench.session_affinity import summarize


def _turn(worker: str, completion: int, accepted: int = 0, rounds: int = 0, seconds: float = 1.0) -> dict:
    usage: dict = {"completion_tokens": completion}
    if rounds:
        usage["speculation"] = {"accepted_tokens": accepted, "drafted_rounds": rounds}
    return {"worker": worker, "usage": usage, "seconds": seconds}


def test_counts_come_from_the_turns_after_each_sessions_first():
    got = summarize(
        [
            [_turn("a", 100, accepted=90, rounds=10), _turn("a", 60, accepted=40, rounds=10), _turn("b", 40)],
            [_turn("b", 10), _turn("b", 30, accepted=20, rounds=10, seconds=3.0)],
        ]
    )
    # later turns: 60 (40 accepted, 10 rounds), 40 (no drafts), 30 (20 accepted, 10 rounds)
    assert got["tau"] == pytest.approx((60 + 20) / 20)
    assert got["tokens_per_forward"] == pytest.approx(130 / (130 - 60))
    assert got["tok_s"] == pytest.approx(130 / 5.0)
    assert got["turns_on_main_worker"] == pytest.approx((2 + 2) / 5)
    # "a" then "b" (a new worker), and "b" again: two of three later turns on a worker that served the session
    assert got["later_turns_on_an_earlier_turns_worker"] == pytest.approx(2 / 3)


def test_no_drafted_round_gives_no_tau():
    assert summarize([[_turn("a", 10), _turn("b", 10)]])["tau"] is None
