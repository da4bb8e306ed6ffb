"""The hybrid drafter: corpus lookup on rows whose match is strong, the neural draft elsewhere (or both trees
merged under one root), loaded from a draft directory naming its parts; greedy output identical to target-only."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import deepspec.decoding.drafters.hybrid as hybrid_module
from deepspec.decoding.draft_driver import DraftDriver
from deepspec.decoding.drafter import DraftSampling, PaddedProposal
from deepspec.decoding.drafters.corpus_lookup import CorpusLookupDrafter, save_corpus
from deepspec.decoding.drafters.hybrid import DEFAULT_MIN_MATCH, HybridDrafter, save_hybrid
from deepspec.decoding.drafters.neural import NeuralDrafter
from deepspec.decoding.drafters.suffix_index import SEPARATOR, SuffixIndex
from deepspec.decoding.engine import SpecEngine
from deepspec.decoding.params import SamplingParams
from deepspec.decoding.registry import build_drafter
from deepspec.decoding.tree import merge_trees
from deepspec.models.drafts import DraftCheckpointError, save_draft
from tests.training.helpers import target_sequences, tiny_draft, tiny_target

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11, 12, 13]]


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def parts(target, tmp_path_factory):
    """(corpus dir, neural dir): the corpus holds the target's own greedy answers to the first two prompts, so
    those rows match it long; the neural part is an untrained DSpark."""
    root = tmp_path_factory.mktemp("parts")
    answers = []
    for prompt in PROMPTS[:2]:
        tokens = torch.tensor([prompt])
        while tokens.shape[1] < len(prompt) + 30:
            out = target.forward(tokens, torch.zeros(1, dtype=torch.long), logits="last")
            tokens = torch.cat([tokens, out.logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        answers += tokens[0].tolist() + [SEPARATOR]
    answers += sum((s + [SEPARATOR] for s in target_sequences(target, 3, 20, seed=4)), [])
    corpus = save_corpus(root / "corpus", SuffixIndex.build(np.array(answers), max_match=8), target.fingerprint())
    neural = save_draft(tiny_draft(target, "dspark", draft_vocab_size=48), root / "dspark")
    return corpus, neural


def _hybrid_dir(parts, tmp_path, **kw):
    corpus, neural = parts
    return save_hybrid(corpus.parent / f"hybrid-{tmp_path.name}", corpus, neural, **kw)  # a sibling of its parts


def _load_hybrid(path, target, **options) -> HybridDrafter:
    """The drafter a hybrid directory loads to, checked to be a hybrid whose parts are a corpus and a neural draft."""
    drafter = build_drafter(str(path), target, **options)
    assert isinstance(drafter, HybridDrafter)
    assert isinstance(drafter.corpus, CorpusLookupDrafter) and isinstance(drafter.neural, NeuralDrafter)
    return drafter


def _neural(drafter: HybridDrafter) -> NeuralDrafter:
    assert isinstance(drafter.neural, NeuralDrafter)
    return drafter.neural


def _corpus(drafter: HybridDrafter) -> CorpusLookupDrafter:
    assert isinstance(drafter.corpus, CorpusLookupDrafter)
    return drafter.corpus


def test_hybrid_directory_names_its_parts_and_loads_them(target, parts, tmp_path):
    path = _hybrid_dir(parts, tmp_path, min_match=3, neural_options={"tree_branches": 2})
    config = json.loads((path / "config.json").read_text())
    assert config["algo"] == "hybrid" and config["corpus"] == "../corpus" and config["neural"] == "../dspark"
    assert config["target"] == target.fingerprint()
    drafter = _load_hybrid(path, target)
    assert drafter.min_match == 3 and drafter.mode == "switch"
    neural = _neural(drafter)
    assert neural.name == "dspark"
    assert neural.tree is not None and neural.tree.branches == 2
    assert drafter.feature_layers == neural.feature_layers and drafter.tree
    # build options override the directory's
    other = _load_hybrid(path, target, mode="merge", neural_options={"tree_branches": 0})
    assert other.mode == "merge" and _neural(other).tree is None


def test_every_default_min_match_is_the_documented_one(target, parts, tmp_path):
    """The constructor, save_hybrid and a config.json without min_match all mean the documented default (the
    loader used to fall back to 3 while the docstring and the writer said 4)."""
    path = _hybrid_dir(parts, tmp_path)
    config = json.loads((path / "config.json").read_text())
    assert config["min_match"] == DEFAULT_MIN_MATCH == 4
    (path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "min_match"}))
    assert _load_hybrid(path, target).min_match == DEFAULT_MIN_MATCH
    assert f"The default min_match {DEFAULT_MIN_MATCH} is the one" in (hybrid_module.__doc__ or "")


def test_hybrid_directory_errors_name_the_problem(target, parts, tmp_path):
    path = _hybrid_dir(parts, tmp_path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "neural": "../missing"}))
    with pytest.raises(DraftCheckpointError, match="neural part .*missing is not a draft directory"):
        build_drafter(str(path), target)
    (path / "config.json").write_text(json.dumps({**config, "mode": "vote"}))
    with pytest.raises(DraftCheckpointError, match="hybrid mode must be one of"):
        build_drafter(str(path), target)
    (path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "corpus"}))
    with pytest.raises(DraftCheckpointError, match="names its 'corpus' draft directory"):
        build_drafter(str(path), target)
    # the corpus part must be a corpus: a neural draft there is refused
    (path / "config.json").write_text(json.dumps({**config, "corpus": config["neural"]}))
    with pytest.raises(DraftCheckpointError, match="must be a corpus-lookup drafter"):
        build_drafter(str(path), target)


def _fed(drafter: HybridDrafter, target, histories) -> DraftDriver:
    """The drafter bound and driven as the engine would: slot s holds histories[s], its neural part fed features."""
    driver = DraftDriver(drafter, num_slots=len(histories), max_tokens=128, target=target)
    for s, h in enumerate(histories):
        driver.start(s, h, torch.randn(1, len(h) - 1, _neural(drafter).cfg.feature_size))
    return driver


def test_switch_takes_the_corpus_on_strong_rows_and_skips_the_neural_forward(target, parts, tmp_path, monkeypatch):
    drafter = _load_hybrid(_hybrid_dir(parts, tmp_path, min_match=3), target)
    corpus, neural = _corpus(drafter), _neural(drafter)
    corpus_index = corpus.index
    strong_history = corpus_index.tokens[:8].tolist()  # the first answer's opening: a long corpus match
    weak_history = [60, 61, 62, 63]  # never in the corpus
    driver = _fed(drafter, target, [strong_history, weak_history])
    view = driver.view
    assert drafter.strong(view, 0) and not drafter.strong(view, 1)
    # what the engine prices with the draft's probed time: the neural part's rows only
    assert drafter.costly_rows(view, [0, 1]) == 1 and drafter.costly_rows(view, [0]) == 0
    greedy = DraftSampling(torch.zeros(2), [None, None])
    prop = driver.propose([0, 1], 4, greedy)
    corpus_prop = corpus.propose(view, [0, 1], 4, greedy).padded(4)
    neural_prop = neural.propose(view, [0, 1], 4, greedy).padded(4)
    n0, n1 = int(prop.num_tokens[0]), int(prop.num_tokens[1])
    assert prop.tokens[0, :n0].tolist() == corpus_prop.tokens[0, :n0].tolist() and n0 == int(corpus_prop.num_tokens[0])
    assert prop.tokens[1, :n1].tolist() == neural_prop.tokens[1, :n1].tolist() and n1 >= 1
    # every row strong: the neural draft is never asked
    calls = []
    monkeypatch.setattr(neural, "propose", lambda *a, **k: calls.append(a))
    driver.propose([0], 4, DraftSampling(torch.zeros(1), [None]))
    assert calls == [] and drafter.rows_drafted["corpus"] >= 2


def test_a_round_looks_each_row_up_in_the_corpus_once(target, parts, tmp_path):
    """The engine asks costly_rows (to price the round) and then propose: one strength lookup (the corpus asked for
    1 token) per row between them, and a fresh one once the row has committed more tokens. (The corpus's proposal
    itself asks for the round's k.)"""
    drafter = _load_hybrid(_hybrid_dir(parts, tmp_path, min_match=3), target)
    corpus = _corpus(drafter)
    history = corpus.index.tokens[:8].tolist()
    driver = _fed(drafter, target, [history, [60, 61, 62, 63]])
    lookups = []
    real_draft = corpus.draft
    corpus.draft = lambda view, slot, k: lookups.append((slot, k)) or real_draft(view, slot, k)
    greedy = DraftSampling(torch.zeros(2), [None, None])
    assert drafter.costly_rows(driver.view, [0, 1]) == 1
    driver.propose([0, 1], 4, greedy)
    assert lookups == [(0, 1), (1, 1), (0, 4), (1, 4)]
    driver.commit([0, 1], [[history[-1]], [60]], torch.randn(2, 1, _neural(drafter).cfg.feature_size))
    drafter.costly_rows(driver.view, [0, 1])
    assert lookups[4:] == [(0, 1), (1, 1)]


def _tree(tokens, survival=None, parents=None) -> PaddedProposal:
    n = len(tokens)
    return PaddedProposal(
        torch.tensor([tokens]),
        torch.tensor([n]),
        None,
        None if survival is None else torch.tensor([survival]),
        None if parents is None else torch.tensor([parents]),
    )


def _parents(proposal: PaddedProposal) -> list[list[int]]:
    """Each row's parent indices: a merged proposal is a tree, so it has them."""
    assert proposal.parents is not None
    return proposal.parents.tolist()


def test_merge_joins_both_trees_under_one_root():
    corpus = _tree([5, 6, 7], [0.9, 0.8, 0.4])  # a chain
    neural = _tree([5, 9, 8, 6], [0.5, 0.3, 0.2, 0.1], [-1, -1, 0, 0])  # 5 and 5→6 repeat the corpus
    merged = merge_trees(corpus, neural, 5)
    # numbered depth by depth, likelier first: 5 (0.9), 9 (0.3) | 5→6 (0.8), 5→8 (0.2) | 5→6→7 (0.4)
    assert merged.tokens.tolist() == [[5, 9, 6, 8, 7]] and _parents(merged) == [[-1, -1, 0, 0, 2]]
    torch.testing.assert_close(merged.survival, torch.tensor([[0.9, 0.3, 0.8, 0.2, 0.4]]))
    assert merged.probs is None and merged.num_tokens.tolist() == [5]
    # a smaller budget keeps the likeliest nodes, parents first
    merged = merge_trees(corpus, neural, 3)
    assert merged.tokens.tolist() == [[5, 6, 7]] and _parents(merged) == [[-1, 0, 1]]
    merged = merge_trees(_tree([5, 6], [0.9, 0.15]), neural, 3)
    assert merged.tokens.tolist() == [[5, 9, 8]] and _parents(merged) == [[-1, -1, 0]]  # 5→6 (0.15) loses
    # without survival on one side the corpus's nodes rank first, then the neural ones in their order
    merged = merge_trees(_tree([5, 6, 7]), neural, 4)
    assert merged.tokens.tolist() == [[5, 9, 6, 7]] and _parents(merged) == [[-1, -1, 0, 2]]
    assert merged.survival is None


def test_merge_keeps_rows_apart_and_ignores_padding():
    """Row by row: equal tokens of different rows never merge, and nodes past num_tokens never join (row 1's corpus
    padding spells 5→4, a neural node's path, with a survival that would show)."""
    corpus = PaddedProposal(
        torch.tensor([[5, 6, 7], [5, 4, 1]]),
        torch.tensor([3, 1]),
        None,
        torch.tensor([[0.9, 0.8, 0.7], [0.9, 0.95, 0.0]]),
    )
    neural = PaddedProposal(
        torch.tensor([[5, 6, 3], [2, 5, 4]]),
        torch.tensor([2, 3]),
        None,
        torch.tensor([[0.5, 0.4, 0.0], [0.6, 0.5, 0.1]]),
        torch.tensor([[-1, 0, 0], [-1, -1, 1]]),
    )
    merged = merge_trees(corpus, neural, 4)
    assert merged.num_tokens.tolist() == [3, 3]
    assert merged.tokens[0, :3].tolist() == [5, 6, 7] and _parents(merged)[0][:3] == [-1, 0, 1]
    assert merged.tokens[1, :3].tolist() == [5, 2, 4] and _parents(merged)[1] == [-1, -1, 0, -1]
    torch.testing.assert_close(merged.survival, torch.tensor([[0.9, 0.8, 0.7, 0.0], [0.9, 0.6, 0.1, 0.0]]))


@pytest.mark.parametrize("mode", ["switch", "merge"])
def test_hybrid_greedy_output_identical_to_target_only(target, parts, tmp_path, mode):
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    base = SpecEngine(target, None, max_batch_size=2, max_seq_len=128).generate(PROMPTS, params)
    path = _hybrid_dir(parts, tmp_path, min_match=3, mode=mode, neural_options={"tree_branches": 2})
    drafter = _load_hybrid(path, target)
    engine = SpecEngine(target, drafter, max_batch_size=2, max_seq_len=128, num_speculative_tokens=6)
    spec = engine.generate(PROMPTS, params)
    assert [r.token_ids for r in spec] == [r.token_ids for r in base]
    assert drafter.rows_drafted["corpus"] > 0 and drafter.rows_drafted["neural" if mode == "switch" else "merged"] > 0


def test_hybrid_sampling_is_seeded(target, parts, tmp_path):
    path = _hybrid_dir(parts, tmp_path, min_match=3, neural_options={"tree_branches": 2})
    engine = SpecEngine(
        target, build_drafter(str(path), target), max_batch_size=4, max_seq_len=128, num_speculative_tokens=6
    )
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=3, ignore_eos=True)
    a = engine.generate(PROMPTS, params)
    b = engine.generate(PROMPTS, params)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
