"""Workloads: eval jsonl files (the shipped ones and bad ones) and the random-word prompts."""

import itertools
import json

import pytest

from deepspec.paths import repo_root
from loadtest.workload import DEFAULT_EVAL_DIR, dataset_requests, load_turns, random_requests


def test_default_prompts_ship_inside_the_loadtest_package():
    """The default workload is the load tester's own data (no deepspec library, no datasets/ folder needed): the
    first 64 records of each eval set, unchanged."""
    assert repo_root() / "loadtest" / "prompts" == DEFAULT_EVAL_DIR
    prompts = load_turns(DEFAULT_EVAL_DIR)
    assert len(prompts) == 5 * 64 and all(isinstance(p, str) and p for p in prompts)
    for sample in sorted(DEFAULT_EVAL_DIR.glob("*.jsonl")):
        full = (repo_root() / "datasets" / "eval" / sample.name).read_text().splitlines()
        assert sample.read_text().splitlines() == full[:64], f"{sample.name}: not the first 64 records of its eval set"


def test_first_turn_of_each_record_and_file_or_dir(tmp_path):
    (tmp_path / "a.jsonl").write_text(
        json.dumps({"turns": ["one", "reply?"]}) + "\n\n" + json.dumps({"turns": ["two"]}) + "\n"
    )
    (tmp_path / "b.jsonl").write_text(json.dumps({"turns": ["three"]}) + "\n")
    assert load_turns(tmp_path) == ["one", "two", "three"]
    assert load_turns(tmp_path / "b.jsonl") == ["three"]


def test_bad_datasets_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="--dataset-path"):
        load_turns(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no \\*.jsonl"):
        load_turns(tmp_path)
    (tmp_path / "bad.jsonl").write_text('{"prompt": "x"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_turns(tmp_path)


def test_dataset_requests_shuffle_with_seed_and_cycle():
    reqs = list(itertools.islice(dataset_requests(["a", "b", "c"], max_tokens=9, ignore_eos=True, seed=1), 6))
    assert sorted(r.prompt for r in reqs[:3]) == ["a", "b", "c"]
    assert [r.prompt for r in reqs[:3]] == [r.prompt for r in reqs[3:]]
    assert all(r.max_tokens == 9 and r.ignore_eos for r in reqs)


def test_random_requests_lengths_and_unique_prefixes():
    reqs = list(
        itertools.islice(random_requests(input_len=100, output_len=20, range_ratio=0.5, seed=0, ignore_eos=False), 200)
    )
    assert all(
        r.prompt_len is not None and 50 <= r.prompt_len <= 150 and len(r.prompt.split()) == r.prompt_len for r in reqs
    )
    assert all(r.max_tokens is not None and 10 <= r.max_tokens <= 30 for r in reqs)
    assert len({r.prompt.split()[0] for r in reqs}) == 200
    fixed = next(random_requests(input_len=8, output_len=4, range_ratio=0.0, seed=0, ignore_eos=True))
    assert (fixed.prompt_len, fixed.max_tokens, fixed.ignore_eos) == (8, 4, True)
    with pytest.raises(ValueError):
        next(random_requests(input_len=8, output_len=4, range_ratio=1.0, seed=0, ignore_eos=True))
