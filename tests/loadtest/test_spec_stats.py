"""Spec-decode counters: summed across label sets, diffed across a run, turned into acceptance statistics."""

import pytest

from loadtest.spec_stats import SpecCounters, diff, parse_counters


def exposition(drafts, draft_tokens, accepted, per_pos, worker="w0", extra=""):
    lbl = f'model="m",worker="{worker}"'
    lines = [
        "# HELP deepspec:spec_decode_num_drafts_total Number of drafts.",
        "# TYPE deepspec:spec_decode_num_drafts_total counter",
        f"deepspec:spec_decode_num_drafts_total{{{lbl}}} {drafts}",
        "# TYPE deepspec:spec_decode_num_draft_tokens_total counter",
        f"deepspec:spec_decode_num_draft_tokens_total{{{lbl}}} {draft_tokens}",
        "# TYPE deepspec:spec_decode_num_accepted_tokens_total counter",
        f"deepspec:spec_decode_num_accepted_tokens_total{{{lbl}}} {accepted}",
        "# TYPE deepspec:spec_decode_num_accepted_tokens_per_pos_total counter",
    ]
    lines += [
        f'deepspec:spec_decode_num_accepted_tokens_per_pos_total{{{lbl},position="{i}"}} {v}'
        for i, v in enumerate(per_pos)
    ]
    return "\n".join(lines) + "\n" + extra


OTHER = (
    "# TYPE deepspec:time_to_first_token_seconds histogram\n"
    'deepspec:time_to_first_token_seconds_bucket{le="0.1"} 3\n'
    "deepspec:time_to_first_token_seconds_count 3\ndeepspec:time_to_first_token_seconds_sum 0.2\n"
    "# TYPE vllm:spec_decode_num_drafts_total counter\nvllm:spec_decode_num_drafts_total 999\n"
)


def test_parse_sums_label_sets_and_ignores_other_metrics():
    # two workers: the gateway's copies carry a `worker` label; the run's totals are their sum.
    text = exposition(10, 40, 25, [9, 8, 5, 3], "w0") + exposition(5, 20, 5, [3, 2, 0, 0], "w1", extra=OTHER)
    # a text with two HELP/TYPE blocks per family is not valid exposition; keep one header per family.
    c = parse_counters(text.replace("# TYPE", "# XTYPE"))
    assert c.present
    assert (c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens) == (15, 60, 30)
    assert c.num_accepted_per_pos == {0: 12, 1: 10, 2: 5, 3: 3}


def test_parse_with_type_lines():
    c = parse_counters(exposition(10, 40, 25, [9, 8, 5, 3], extra=OTHER))
    assert (c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens) == (10, 40, 25)


def test_diff_gives_acceptance_rate_and_length():
    before = parse_counters(exposition(100, 400, 150, [60, 50, 30, 10]))
    after = parse_counters(exposition(300, 1200, 550, [260, 200, 80, 10]))
    s = diff(before, after)
    assert s is not None
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (200, 800, 400)
    assert s.acceptance_rate == pytest.approx(0.5)  # 400 / 800
    assert s.acceptance_length == pytest.approx(3.0)  # 1 + 400 / 200
    assert s.per_position_acceptance_rate == pytest.approx([1.0, 0.75, 0.25, 0.0])
    assert s.acceptance_length is not None
    assert sum(s.per_position_acceptance_rate) == pytest.approx(s.acceptance_length - 1)


def test_no_counters_means_none_and_no_drafts_means_no_rates():
    assert diff(SpecCounters(), parse_counters(OTHER)) is None
    same = parse_counters(exposition(10, 40, 20, [5]))
    s = diff(same, same)
    assert s is not None and s.num_drafts == 0 and s.acceptance_rate is None and s.acceptance_length is None


def test_counter_reset_during_run_uses_the_after_value():
    before = parse_counters(exposition(1000, 4000, 2000, [1000]))
    after = parse_counters(exposition(10, 40, 20, [10]))  # server restarted
    s = diff(before, after)
    assert s is not None
    assert (s.num_drafts, s.num_accepted_tokens) == (10, 20)
