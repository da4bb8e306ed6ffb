"""The corpus stage: the target's regenerated answers → the suffix index a corpus-lookup drafter drafts from.

No gradient step: the "training" of corpus lookup is choosing its text. Only assistant tokens go in (what the
target wrote, including its end-of-turn token), one SEPARATOR after each answer, tokenized exactly as `train`
tokenizes them. The eval sets never go in: `prepare` refuses nothing, so pass it training prompts only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from training.data import DataStats, Sequence, load_sequences


def assistant_spans(sequence: Sequence) -> list[list[int]]:
    """The maximal runs of loss-masked (assistant) tokens of one conversation, in order."""
    spans, current = [], []
    for token, is_assistant in zip(sequence.input_ids, sequence.loss_mask):
        if is_assistant:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    if current:
        spans.append(current)
    return spans


def corpus_tokens(sequences: list[Sequence]) -> np.ndarray:
    """Every answer followed by SEPARATOR, as one int32 array."""
    from deepspec.decoding.drafters.suffix_index import SEPARATOR

    out: list[int] = []
    for sequence in sequences:
        for span in assistant_spans(sequence):
            out.extend(span)
            out.append(SEPARATOR)
    return np.asarray(out, dtype=np.int32)


def build_corpus(paths: list[Path], target, out: Path, *, max_match: int = 12, min_match: int = 1,
                 max_len: int = 4096, log=None) -> dict:
    """Tokenize, index and save; returns the summary also written into config.json."""
    from deepspec.decoding.drafters.corpus_lookup import save_corpus
    from deepspec.decoding.drafters.suffix_index import SuffixIndex

    log = log or (lambda line: None)
    stats = DataStats()
    sequences = load_sequences(paths, target.tokenizer, max_len, stats)
    if stats.num_malformed:
        log(f"skipped {stats.num_malformed} malformed rows (first: {stats.problems[0]})")
    tokens = corpus_tokens(sequences)
    log(f"indexing {len(tokens):,} tokens from {len(sequences)} conversations (max match {max_match})")
    index = SuffixIndex.build(tokens, max_match)
    summary = {"num_conversations": len(sequences), "num_malformed": stats.num_malformed,
               "data": [str(p) for p in paths]}
    save_corpus(out, index, target.fingerprint(), min_corpus_match=min_match, extra=summary)
    return {**summary, "num_tokens": len(index), "max_match": max_match, "min_corpus_match": min_match,
            "out": str(out)}
