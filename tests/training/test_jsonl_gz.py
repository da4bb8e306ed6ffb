"""Gzip-compressed JSON lines (`.jsonl.gz`): the shipped regenerated data is stored that way, so every reader of
training data (train, corpus, prepare's prompts and its resumable output) must read it exactly like the plain file."""

from __future__ import annotations

import gzip
import json

import pytest

from deepspec.paths import repo_root
from tests.training.helpers import tear_gzip
from training.data import load_sequences, read_jsonl_lines, recover_torn_gzip
from training.prepare import PrepareStats, finished_ids, read_prompts, regenerate

SHIPPED = repo_root() / "training" / "data" / "smollm2-135m-regen.jsonl.gz"


def _conversations(n: int) -> list[str]:
    return [
        json.dumps(
            {
                "id": f"p:{i}",
                "conversations": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i} " * 3}],
            }
        )
        for i in range(n)
    ]


def test_gzip_and_plain_files_give_the_same_sequences(tmp_path):
    lines = [json.dumps({"input_ids": list(range(i, i + 6)), "loss_mask": [0, 0, 1, 1, 1, 1]}) for i in range(5)]
    plain, packed = tmp_path / "c.jsonl", tmp_path / "c.jsonl.gz"
    plain.write_text("\n".join(lines) + "\n")
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    got = load_sequences([packed], None, 64)
    assert got == load_sequences([plain], None, 64) and len(got) == 5


def test_prompt_ids_do_not_depend_on_compression(tmp_path):
    """Row ids are `<stem>:<line>` and a regenerated file is resumed by them: `p.jsonl.gz` must give `p:1`, as
    `p.jsonl` does, or re-running prepare on compressed prompts would redo every row."""
    text = "\n".join(json.dumps({"turns": [f"q{i}"]}) for i in range(3)) + "\n"
    (tmp_path / "p.jsonl").write_text(text)
    (tmp_path / "gz").mkdir()
    (tmp_path / "gz" / "p.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    plain = read_prompts([tmp_path / "p.jsonl"], None, 0, PrepareStats())
    packed = read_prompts([tmp_path / "gz" / "p.jsonl.gz"], None, 0, PrepareStats())
    assert [r.id for r in packed] == [r.id for r in plain] == ["p:1", "p:2", "p:3"]
    assert [r.source for r in packed] == ["p"] * 3


def test_prepare_appends_to_and_resumes_a_gzip_output(tmp_path):
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps({"turns": [f"q{i}"]}) for i in range(4)) + "\n")
    rows = read_prompts([tmp_path / "p.jsonl"], None, 0, PrepareStats())
    out = tmp_path / "regen.jsonl.gz"
    regenerate(rows[:2], lambda batch: [("first", 1)] * len(batch), out, 2, PrepareStats())
    stats = regenerate(rows, lambda batch: [("second", 1)] * len(batch), out, 2, PrepareStats())
    assert stats.num_skipped == 2 and stats.num_done == 2
    assert finished_ids(out) == {r.id for r in rows}
    with gzip.open(out, "rt") as lines:
        answers = [json.loads(line)["conversations"][-1]["content"] for line in lines]
    assert answers == ["first", "first", "second", "second"]


def test_a_truncated_gzip_file_names_itself(tmp_path):
    packed = tmp_path / "c.jsonl.gz"
    data = gzip.compress(("\n".join(_conversations(50)) + "\n").encode())
    packed.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="c.jsonl.gz: not a readable gzip file"):
        read_jsonl_lines(packed)


def test_a_file_a_killed_writer_cut_short_is_mended_to_its_whole_lines(tmp_path):
    """Appending writers flush every few rows; killed, they leave a last member without its end, which every reader
    refuses. The owner mends it at its next start: the whole lines stay, the cut one goes, and appending goes on."""
    packed = tmp_path / "c.jsonl.gz"
    rows = _conversations(5)
    with gzip.open(packed, "wt", encoding="utf-8") as f:
        f.write("\n".join(rows[:3]) + "\n")
    tear_gzip(packed, rows[3] + "\n" + rows[4][:20])
    with pytest.raises(ValueError, match="not a readable gzip file"):
        read_jsonl_lines(packed)
    assert recover_torn_gzip(packed) == 4
    assert read_jsonl_lines(packed) == rows[:4]
    with gzip.open(packed, "at", encoding="utf-8") as f:
        f.write(rows[4] + "\n")
    assert read_jsonl_lines(packed) == rows
    assert recover_torn_gzip(packed) is None  # a whole file is left as it is
    plain = tmp_path / "c.jsonl"
    plain.write_text(rows[0][:10])
    assert recover_torn_gzip(plain) is None and plain.read_text() == rows[0][:10]


def test_the_shipped_regenerated_data_reads_as_its_documented_rows():
    """training/data/README.md: 4,856 conversations, the first 1,976 of them the neural drafts' data."""
    rows = [json.loads(line) for line in read_jsonl_lines(SHIPPED)]
    assert len(rows) == 4856 and all(row["conversations"][-1]["role"] == "assistant" for row in rows)


def test_each_prompt_file_may_have_its_own_limit(tmp_path):
    """synth answers every synthetic prompt and only `--mix-limit-per-file` rows of each mix file: a limit per file
    (None = all of it). One limit for every file had capped the synthetic prompts at the mix's limit too."""
    for name, n in (("synth", 6), ("mix", 6)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"turns": [f"{name}{i}"]}) + "\n" for i in range(n)))
    paths = [tmp_path / "synth.jsonl", tmp_path / "mix.jsonl"]
    rows = read_prompts(paths, [None, 2], 0, PrepareStats())
    assert sum(r.id.startswith("synth:") for r in rows) == 6 and sum(r.id.startswith("mix:") for r in rows) == 2
    assert len(read_prompts(paths, 2, 0, PrepareStats())) == 4  # one limit for every file, as before
