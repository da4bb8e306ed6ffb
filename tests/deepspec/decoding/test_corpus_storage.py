"""corpus.safetensors storage: uint16 tokens (SEPARATOR as 0xFFFF) and no stored suffix array — it is rebuilt at
load, so the shipped index is a quarter of its int32 + suffix-array size; older int32 files still load."""

from __future__ import annotations

import numpy as np
from safetensors.numpy import load_file, save_file

from deepspec.decoding.drafters.corpus_lookup import CORPUS_FILE, UINT16_SEPARATOR, load_corpus_index, save_corpus
from deepspec.decoding.drafters.suffix_index import SEPARATOR, SuffixIndex, build_suffix_array

FINGERPRINT = {"architecture": "llama", "hidden_size": 8, "num_layers": 2, "vocab_size": 50, "tokenizer_hash": "x"}


def _corpus(vocab_size: int, num_answers: int = 40, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    parts = []
    for _ in range(num_answers):
        parts += rng.integers(0, vocab_size, rng.integers(1, 30)).tolist() + [SEPARATOR]
    return np.array(parts, dtype=np.int32)


def _reference_suffix_array(tokens: np.ndarray, max_match: int) -> np.ndarray:
    """Sorted by the first max_match tokens of each reversed suffix (padded with -2), ties in corpus order."""
    rev = np.concatenate([tokens[::-1], np.full(max_match, -2, dtype=np.int64)])
    keys = [tuple(rev[i : i + max_match]) for i in range(len(tokens))]
    return np.array(sorted(range(len(tokens)), key=lambda i: (keys[i], i)), dtype=np.int32)


def test_the_index_is_stored_as_uint16_tokens_and_rebuilt_identically(tmp_path):
    tokens = _corpus(vocab_size=49152)
    built = SuffixIndex.build(tokens, max_match=6)
    path = save_corpus(tmp_path / "c", built, FINGERPRINT)
    stored = load_file(str(path / CORPUS_FILE))
    assert set(stored) == {"tokens"} and stored["tokens"].dtype == np.uint16
    assert int((stored["tokens"] == UINT16_SEPARATOR).sum()) == int((tokens == SEPARATOR).sum()) == 40
    loaded = load_corpus_index(path, 6)
    assert np.array_equal(loaded.tokens, tokens) and np.array_equal(loaded.suffix_array, built.suffix_array)
    context = tokens[10:14].tolist()
    assert loaded.longest_match(context)[0] == built.longest_match(context)[0]


def test_ids_past_uint16_stay_int32(tmp_path):
    tokens = np.array([70000, 3, SEPARATOR, 70000, 4, SEPARATOR], dtype=np.int32)
    path = save_corpus(tmp_path / "c", SuffixIndex.build(tokens, 4), FINGERPRINT)
    assert load_file(str(path / CORPUS_FILE))["tokens"].dtype == np.int32
    assert np.array_equal(load_corpus_index(path, 4).tokens, tokens)


def test_an_int32_file_with_its_suffix_array_still_loads(tmp_path):
    tokens = _corpus(vocab_size=50)
    index = SuffixIndex.build(tokens, 4)
    path = save_corpus(tmp_path / "c", index, FINGERPRINT)
    save_file({"tokens": tokens, "suffix_array": index.suffix_array}, str(path / CORPUS_FILE))
    loaded = load_corpus_index(path, 4)
    assert np.array_equal(loaded.tokens, tokens) and np.array_equal(loaded.suffix_array, index.suffix_array)


def test_the_uint16_sort_gives_the_suffix_order():
    """build_suffix_array sorts 16-bit keys when the ids allow: the order must be the plain lexicographic one, and
    the same as int32 keys give for ids that do not fit 16 bits."""
    for vocab_size in (50, 49152, 70000):
        tokens = _corpus(vocab_size, num_answers=25, seed=vocab_size)
        assert np.array_equal(build_suffix_array(tokens, 5), _reference_suffix_array(tokens, 5)), vocab_size
