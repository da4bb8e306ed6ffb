"""deepspec.paths: the prompt sets ship with the checkout and load from there, or from DEEPSPEC_DATASETS_DIR."""

import json

import pytest

from deepspec.paths import datasets_dir, eval_dataset, repo_root
from training.data import read_jsonl_lines

#: every shipped prompt set and its record count (datasets/README.md lists the same)
SHIPPED = {
    "eval/gsm8k.jsonl": 1319,
    "eval/math500.jsonl": 500,
    "eval/humaneval.jsonl": 164,
    "eval/mbpp.jsonl": 257,
    "eval/lbpp.jsonl": 162,
    "eval/chat.jsonl": 40,
    "train/gsm8k_train.jsonl.gz": 7473,
    "train/codealpaca.jsonl.gz": 6552,
}


def test_the_prompt_sets_ship_in_the_checkout_and_every_record_has_a_first_turn(monkeypatch):
    monkeypatch.delenv("DEEPSPEC_DATASETS_DIR", raising=False)
    assert datasets_dir() == repo_root() / "datasets"
    readme = (datasets_dir() / "README.md").read_text()
    shipped = [*datasets_dir().glob("*/*.jsonl"), *datasets_dir().glob("*/*.jsonl.gz")]
    assert sorted(str(p.relative_to(datasets_dir())) for p in shipped) == sorted(SHIPPED)
    for name, count in SHIPPED.items():
        records = [json.loads(line) for line in read_jsonl_lines(datasets_dir() / name)]
        assert len(records) == count, name
        assert all(isinstance(r["turns"][0], str) and r["turns"][0].strip() for r in records), name
        assert f"`{name.split('/')[1]}` | {count:,} |" in readme, f"datasets/README.md does not describe {name}"
    assert eval_dataset("humaneval") == datasets_dir() / "eval" / "humaneval.jsonl"


def test_the_environment_points_at_another_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("DEEPSPEC_DATASETS_DIR", str(tmp_path))
    assert datasets_dir() == tmp_path and eval_dataset("x") == tmp_path / "eval" / "x.jsonl"


@pytest.mark.parametrize("name", ["humaneval", "gsm8k", "mbpp"])
def test_the_benchmark_sets_the_tools_default_to_exist(monkeypatch, name):
    """bench.decode, training eval and the fidelity tests read these three by default."""
    monkeypatch.delenv("DEEPSPEC_DATASETS_DIR", raising=False)
    assert eval_dataset(name).is_file()
