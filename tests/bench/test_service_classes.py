"""bench.service_classes: the fairness arithmetic and the summary it prints (the run itself is the benchmark)."""

import pytest

from bench.service_classes import shares, statuses


def _served(tokens: int, finished: float = 1.0) -> dict:
    return {"status": 200, "tokens": tokens, "finished": finished}


def test_shares_count_tokens_served_in_the_window_against_the_weights():
    got = shares(
        {
            "sk-bulk-1": [_served(100), _served(100), _served(500, finished=9.0)],
            "sk-bulk-2": [_served(400), {"status": 429, "reason": "queue_full"}],
        },
        until=5.0,
    )
    assert got["keys"]["sk-bulk-1"]["share"] == pytest.approx(1 / 3)  # the request finished late is left out
    assert got["keys"]["sk-bulk-2"]["weight_share"] == pytest.approx(2 / 3)
    assert got["jain_index"] == pytest.approx(1.0)  # 200 / 1 and 400 / 2: equal weighted rates


def test_jains_index_falls_when_one_key_gets_everything():
    got = shares({"sk-bulk-1": [_served(900)], "sk-bulk-2": [_served(0)]}, until=5.0)
    assert got["jain_index"] == pytest.approx(0.5)


def test_statuses_name_the_drop_reason():
    assert statuses(
        [{"status": 200}, {"status": 429, "reason": "queue_full"}, {"status": 429, "reason": "queue_full"}]
    ) == {"200": 1, "429 queue_full": 2}
