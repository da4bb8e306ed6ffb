"""`python -m training corpus`: regenerated answers → a corpus-lookup draft the engine loads and drafts from."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from deepspec.decoding.draft_driver import DraftDriver
from deepspec.decoding.drafter import DraftSampling
from deepspec.decoding.drafters.corpus_lookup import CorpusLookupDrafter
from deepspec.decoding.drafters.suffix_index import SEPARATOR
from deepspec.decoding.registry import build_drafter
from deepspec.models import load_target
from tests.training.helpers import tiny_hf_target_dir
from training.__main__ import main
from training.corpus import answer_spans
from training.data import Sequence


def test_answer_spans_are_the_masked_runs():
    seq = Sequence([1, 2, 3, 4, 5, 6, 7, 8], [0, 1, 1, 0, 0, 1, 0, 1])
    assert answer_spans(seq) == [(1, [2, 3]), (5, [6]), (7, [8])]


def test_slot_acceptance_replays_greedy_decoding_of_held_out_answers():
    from deepspec.decoding.drafters.corpus_lookup import CorpusLookupDrafter
    from deepspec.decoding.drafters.suffix_index import SuffixIndex
    from training.corpus import measure_slot_acceptance

    drafter = CorpusLookupDrafter(SuffixIndex.build(np.array([1, 2, 3, 4, 5, SEPARATOR]), max_match=4))
    held_out = Sequence([9, 1, 2, 3, 4, 7], [0, 1, 1, 1, 1, 1])
    table = measure_slot_acceptance(drafter, [held_out], k=4, prior=0.5, prior_weight=2.0)
    # after "9" nothing matches, the target writes 1; after "1" the corpus drafts 2 3 4 5 and the answer goes
    # 2 3 4 7: slots 0-2 accepted, slot 3 reached and rejected
    assert table == {"corpus_1": pytest.approx([2 / 3, 2 / 3, 2 / 3, 1 / 3], abs=1e-4)}


def test_node_acceptance_replays_trees_over_held_out_answers():
    from deepspec.decoding.drafters.corpus_lookup import CorpusLookupDrafter
    from deepspec.decoding.drafters.corpus_tree import NodeAcceptance
    from deepspec.decoding.drafters.suffix_index import SuffixIndex
    from training.corpus import measure_node_acceptance

    S = SEPARATOR
    drafter = CorpusLookupDrafter(SuffixIndex.build(np.array([1, 2, 3, 4, S, 1, 2, 5, 6, S]), max_match=4), tree=True)
    held_out = Sequence([9, 1, 2, 3, 4, 7], [0, 0, 1, 1, 1, 1])
    table = measure_node_acceptance(drafter, [held_out], k=16, prior_weight=2.0)
    # after "9 1" the tree is 2 → {3 → 4, 5 → 6}; the answer 2 3 4 7 accepts 2 (depth 1, two occurrences agree),
    # then 3 of {3, 5} (depth 2, 1/2 each), then 4 (depth 3, one occurrence); 6 is never reached
    assert list(table) == ["corpus_1"]
    cells = np.array(table["corpus_1"])
    assert cells[0, 1, 9] == pytest.approx((1 + 2 * 0.95) / 3, abs=1e-4)
    assert cells[1, 1, 5] == pytest.approx((1 + 2 * 0.55) / 4, abs=1e-4)
    assert cells[2, 0, 9] == pytest.approx((1 + 2 * 0.95) / 3, abs=1e-4)
    assert cells[4, 2, 3] == pytest.approx(0.35)  # never reached: its frequency
    assert (np.diff(cells, axis=-1) >= 0).all()  # the most frequent child stays first
    NodeAcceptance(table)  # the layout the drafter reads


def test_cli_builds_a_draft_the_engine_drafts_from(tmp_path, capsys):
    target_dir = tiny_hf_target_dir(tmp_path / "target")
    data = tmp_path / "regen.jsonl"
    answers = ["def add(a, b):\n    return a + b", "The answer is 42."]
    rows = [
        {
            "id": f"r{i}",
            "conversations": [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": a}],
        }
        for i, a in enumerate(answers)
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n{broken\n")
    out = tmp_path / "corpus"
    assert (
        main(["corpus", "--data", str(data), "--out", str(out), "--target", str(target_dir), "--max-match", "8"]) == 0
    )
    captured = capsys.readouterr()
    assert "skipped 1 malformed rows" in captured.err
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert summary["num_conversations"] == 2

    target = load_target(str(target_dir))
    drafter = build_drafter(str(out), target)
    assert isinstance(drafter, CorpusLookupDrafter)
    tokens = drafter.index.tokens
    # each answer once, with the end-of-turn token the target wrote (and the template's newline after it, masked
    # like training masks it), then a separator; no user text
    end_of_turn = target.tokenizer.convert_tokens_to_ids("<|im_end|>")
    spans = np.split(tokens, np.flatnonzero(tokens == SEPARATOR) + 1)[:-1]
    assert len(spans) == len(answers)
    for answer, span in zip(answers, spans):
        want = target.tokenizer(answer, add_special_tokens=False)["input_ids"] + [end_of_turn]
        assert span[: len(want)].tolist() == want and span[-1] == SEPARATOR and len(span) <= len(want) + 2
    assert summary["num_tokens"] == len(tokens)

    # a sequence that has just written "return a" drafts the rest of the first answer
    history = target.tokenizer("x = 1\nreturn a", add_special_tokens=False)["input_ids"]
    driver = DraftDriver(drafter, num_slots=1, max_tokens=len(history) + 8, target=target)
    driver.start(0, history)
    proposal = driver.propose([0], 4, DraftSampling(torch.zeros(1), [None]))
    assert (
        proposal.tokens[0, : int(proposal.num_tokens[0])].tolist()
        == target.tokenizer(" + b", add_special_tokens=False)["input_ids"]
    )


def test_cli_errors_are_clear(tmp_path, capsys):
    target_dir = tiny_hf_target_dir(tmp_path / "target")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert main(["corpus", "--data", str(empty), "--out", str(tmp_path / "o"), "--target", str(target_dir)]) == 2
    assert "no usable training rows" in capsys.readouterr().err
    assert (
        main(
            [
                "corpus",
                "--data",
                str(tmp_path / "missing.jsonl"),
                "--out",
                str(tmp_path / "o"),
                "--target",
                str(target_dir),
            ]
        )
        == 2
    )
    assert "training data not found" in capsys.readouterr().err
