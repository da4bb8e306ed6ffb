"""Corpus lookup: the suffix index against brute force, the drafter's order of sources, and its checkpoint."""

import json
import random
from typing import cast

import numpy as np
import pytest
import torch

from deepspec.decoding.draft_driver import DraftDriver
from deepspec.decoding.drafter import DraftSampling
from deepspec.decoding.drafters.corpus_lookup import CORPUS_FILE, CorpusLookupDrafter, save_corpus
from deepspec.decoding.drafters.suffix_index import SEPARATOR, SuffixIndex
from deepspec.decoding.registry import build_drafter
from deepspec.models.drafts import DraftCheckpointError, DraftTargetMismatchError, best_shipped_draft
from deepspec.models.target import Target
from tests.deepspec.decoding.checked import drafter_of, survival_of

GREEDY = DraftSampling(torch.zeros(1), [None])
S = SEPARATOR


def _brute_force_match(tokens: list[int], context: list[int], max_match: int) -> tuple[int, set[int]]:
    """Longest suffix of context (<= max_match) that occurs inside one answer; the indices right after it."""
    for m in range(min(max_match, len(context)), 0, -1):
        suffix = context[-m:]
        after = {i + m for i in range(len(tokens) - m + 1) if tokens[i : i + m] == suffix}
        if after:
            return m, after
    return 0, set()


@pytest.mark.parametrize("gather_limit", [0, 10**9], ids=["bisect", "gather"])
def test_longest_match_agrees_with_brute_force(monkeypatch, gather_limit):
    """Both ways of narrowing a matched range (bisection for wide ranges, a gathered column for narrow ones)."""
    monkeypatch.setattr("deepspec.decoding.drafters.suffix_index._GATHER_LIMIT", gather_limit)
    rng = random.Random(0)
    tokens = []
    for _ in range(40):
        tokens += [rng.randrange(4) for _ in range(rng.randrange(1, 12))] + [S]
    index = SuffixIndex.build(np.array(tokens), max_match=5)
    for _ in range(300):
        context = [rng.randrange(5) for _ in range(rng.randrange(1, 9))]  # token 4 never occurs
        matched, positions = index.longest_match(context)
        want_m, want_after = _brute_force_match(tokens, context, 5)
        assert matched == want_m, context
        assert set(positions.tolist()) == want_after, context


def test_continuation_follows_the_majority_and_stops_at_the_end_of_an_answer():
    #            0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15
    tokens = [5, 6, 7, 8, S, 1, 6, 7, 9, S, 2, 6, 7, 8, 3, S]
    index = SuffixIndex.build(np.array(tokens), max_match=4)
    matched, positions = index.longest_match([0, 6, 7])
    assert matched == 2 and sorted(positions.tolist()) == [3, 8, 13]
    drafted, agreement = index.continuation(positions, 5)
    # 8 follows two of three occurrences; after "6 7 8" one answer ends and one goes on with 3
    assert drafted == [8, 3] and agreement == pytest.approx([2 / 3, 1 / 2])


def test_an_index_built_for_other_tokens_is_refused():
    tokens = np.array([3, 1, 2, S], dtype=np.int32)
    with pytest.raises(ValueError, match="not sorted"):
        SuffixIndex(tokens, np.arange(4, dtype=np.int32), max_match=2)
    with pytest.raises(ValueError, match="not a permutation"):
        SuffixIndex(tokens, np.array([3, 2, 2, 0], dtype=np.int32), max_match=2)
    with pytest.raises(ValueError, match="does not index"):
        SuffixIndex(tokens, np.arange(3, dtype=np.int32), max_match=2)


def _driven(corpus: list[int], history: list[int]) -> DraftDriver:
    """A corpus-lookup drafter driven as the engine drives it, its slot 0 holding `history`."""
    driver = DraftDriver(
        CorpusLookupDrafter(SuffixIndex.build(np.array(corpus), max_match=6), min_ngram=2, max_ngram=3),
        num_slots=1,
        max_tokens=64,
    )
    driver.start(0, history)
    return driver


def test_prompt_lookup_comes_first_then_the_corpus():
    corpus = [1, 2, 3, 40, 41, 42, S]
    in_context = _driven(corpus, [9, 2, 3, 7, 7, 1, 2, 3])
    assert in_context.propose([0], 3, GREEDY).tokens[0].tolist() == [7, 7, 1]
    from_corpus = _driven(corpus, [9, 8, 1, 2, 3])
    p = from_corpus.propose([0], 5, GREEDY)
    assert p.num_tokens.tolist() == [3] and p.tokens[0, :3].tolist() == [40, 41, 42]
    nothing = _driven(corpus, [9, 8, 77])
    assert nothing.propose([0], 5, GREEDY).num_tokens.tolist() == [0]


def test_survival_comes_from_the_measured_table_of_each_draft_source():
    corpus = [1, 2, 3, 40, 41, 42, S]
    d = _driven(corpus, [9, 8, 1, 2, 3])  # corpus match of 3 tokens
    drafter = drafter_of(d.drafter, CorpusLookupDrafter)
    drafter.slot_acceptance = {"corpus_3": [0.5, 0.8, 0.5, 0.1], "prompt_lookup": [0.9] * 4}
    p = d.propose([0], 4, GREEDY)
    assert p.num_tokens.tolist() == [3]
    assert survival_of(p)[0].tolist() == pytest.approx([0.5, 0.4, 0.2, 0.0])
    drafter.slot_acceptance = {"prompt_lookup": [0.9] * 4}  # never measured corpus_3: the engine's record decides
    assert d.propose([0], 4, GREEDY).survival is None


def test_min_corpus_match_skips_short_matches(tmp_path):
    corpus = [1, 2, 3, 40, 41, S]
    history = [9, 8, 3]  # only "3" occurs in the corpus
    assert _driven(corpus, history).propose([0], 2, GREEDY).tokens[0].tolist() == [40, 41]
    strict = _driven(corpus, history)
    drafter_of(strict.drafter, CorpusLookupDrafter).min_corpus_match = 2
    assert strict.propose([0], 2, GREEDY).num_tokens.tolist() == [0]
    # the shipped default travels in config.json
    path = save_corpus(tmp_path / "c", SuffixIndex.build(np.array(corpus), 4), FINGERPRINT, min_corpus_match=2)
    assert drafter_of(build_drafter(str(path), stub_target(FINGERPRINT)), CorpusLookupDrafter).min_corpus_match == 2


class _FingerprintOnly:
    name = "stub"

    def __init__(self, fingerprint: dict):
        self._fingerprint = fingerprint

    def fingerprint(self) -> dict:
        return dict(self._fingerprint)


def stub_target(fingerprint: dict) -> Target:
    """A target as far as loading a corpus draft reads one: its name and fingerprint, nothing it would run."""
    return cast(Target, _FingerprintOnly(fingerprint))


FINGERPRINT = {"architecture": "llama", "hidden_size": 8, "num_layers": 2, "vocab_size": 50, "tokenizer_hash": "x"}


def _eval_json(path, tau: float, speedup: float = 1.2) -> None:
    (path / "eval.json").write_text(
        json.dumps(
            {"results": [{"dataset": "humaneval", "temperature": 0, "acceptance_length": tau, "speedup": speedup}]}
        )
    )


def test_checkpoint_round_trip_mismatch_corruption_and_auto_choice(tmp_path):
    index = SuffixIndex.build(np.array([1, 2, 3, 4, S, 1, 2, 5, S]), max_match=4)
    path = save_corpus(tmp_path / "drafts" / "tiny-corpus", index, FINGERPRINT)
    drafter = build_drafter(str(path), stub_target(FINGERPRINT))
    assert isinstance(drafter, CorpusLookupDrafter) and len(drafter.index) == 9

    with pytest.raises(DraftTargetMismatchError, match="hidden_size: draft was trained on 8, target has 16"):
        build_drafter(str(path), stub_target({**FINGERPRINT, "hidden_size": 16}))

    _eval_json(path, tau=2.4)
    assert best_shipped_draft(stub_target(FINGERPRINT), tmp_path / "drafts", min_acceptance_length=2.0) == path
    _eval_json(path, tau=2.4, speedup=0.9)  # measured slower than target-only: auto must not take it
    assert best_shipped_draft(stub_target(FINGERPRINT), tmp_path / "drafts", min_acceptance_length=2.0) is None

    # a directory from before trees (no node table, no drafting defaults) drafts chains; the defaults travel
    assert drafter.tree is False and drafter.acceptance.tables == {}
    config = json.loads((path / "config.json").read_text())
    table = np.full((8, 4, 10), 0.5).tolist()
    config.update(node_acceptance={"corpus_2": table}, drafting={"tree": True, "sampled": True})
    (path / "config.json").write_text(json.dumps(config))
    drafter = drafter_of(build_drafter(str(path), stub_target(FINGERPRINT)), CorpusLookupDrafter)
    assert drafter.tree and drafter.sampled and drafter.acceptance.corpus("corpus_2", 1, 5, 0.9) == 0.5
    assert drafter_of(build_drafter(str(path), stub_target(FINGERPRINT), tree=False), CorpusLookupDrafter).tree is False
    config["node_acceptance"] = {"corpus_2": [[0.5]]}
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(DraftCheckpointError, match="node acceptance table corpus_2 has shape"):
        build_drafter(str(path), stub_target(FINGERPRINT))
    config.pop("node_acceptance")
    (path / "config.json").write_text(json.dumps(config))

    data = (path / CORPUS_FILE).read_bytes()
    (path / CORPUS_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(DraftCheckpointError, match="cannot read the corpus index"):
        build_drafter(str(path), stub_target(FINGERPRINT))
