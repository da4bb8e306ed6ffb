"""The corpus stage: the target's regenerated answers → the suffix index a corpus-lookup drafter drafts from.

No gradient step: the "training" of corpus lookup is choosing its text. Only assistant tokens go in (what the
target wrote, including its end-of-turn token), one SEPARATOR after each answer, tokenized exactly as `train`
tokenizes them. Like a trained draft's, its data must come from training prompts: an index of answers to the eval
prompts would draft the benchmark's own text.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from deepspec.decoding.draft_driver import DraftDriver
from training.data import DataStats, Sequence, load_sequences


def answer_spans(sequence: Sequence) -> list[tuple[int, list[int]]]:
    """(start index, tokens) of each maximal run of loss-masked (assistant) tokens of one conversation, in order."""
    spans, start = [], None
    for i, is_assistant in enumerate([*sequence.loss_mask, 0]):
        if is_assistant and start is None:
            start = i
        elif not is_assistant and start is not None:
            spans.append((start, sequence.input_ids[start:i]))
            start = None
    return spans


def corpus_tokens(sequences: list[Sequence]) -> np.ndarray:
    """Every answer followed by SEPARATOR, as one int32 array."""
    from deepspec.decoding.drafters.suffix_index import SEPARATOR

    out: list[int] = []
    for sequence in sequences:
        for _, span in answer_spans(sequence):
            out.extend(span)
            out.append(SEPARATOR)
    return np.asarray(out, dtype=np.int32)


def measure_slot_acceptance(
    drafter, sequences: list[Sequence], k: int, prior: float = 0.5, prior_weight: float = 2.0
) -> dict[str, list[float]]:
    """Replay greedy decoding of held-out answers with `drafter` (a CorpusLookupDrafter): the regenerated answer
    *is* the target's greedy output, so a draft token is accepted iff it equals the answer's next token. Returns
    source → [k] P(slot j accepted | every slot before it accepted), shrunk toward `prior` by `prior_weight`
    pseudo-counts so a rarely seen source does not read as certain."""
    reached: dict[str, np.ndarray] = {}
    accepted: dict[str, np.ndarray] = {}
    for sequence in sequences:
        for start, answer in answer_spans(sequence):
            if start == 0:
                continue  # nothing to draft from
            context = sequence.input_ids[:start]
            replay = DraftDriver(drafter, num_slots=1, max_tokens=len(context) + len(answer) + 1)
            replay.start(0, list(context))
            position = 0
            while position < len(answer):
                draft, source = drafter.draft(replay.view, 0, k)
                num_accepted = 0
                while (
                    num_accepted < len(draft)
                    and position + num_accepted < len(answer)
                    and draft[num_accepted] == answer[position + num_accepted]
                ):
                    num_accepted += 1
                if draft:
                    reached.setdefault(source, np.zeros(k))[: min(num_accepted + 1, len(draft))] += 1
                    accepted.setdefault(source, np.zeros(k))[:num_accepted] += 1
                committed = answer[position : position + num_accepted + 1]
                replay.commit([0], [committed])
                position += len(committed)
    return {
        source: ((accepted[source] + prior * prior_weight) / (reached[source] + prior_weight)).round(4).tolist()
        for source in sorted(reached)
    }


def _replay(sequences: list[Sequence]):
    """(context, answer) of every assistant turn that has a context to draft from."""
    for sequence in sequences:
        for start, answer in answer_spans(sequence):
            if start > 0:
                yield sequence.input_ids[:start], answer


def measure_node_acceptance(drafter, sequences: list[Sequence], k: int, prior_weight: float = 2.0) -> dict:
    """Replay greedy decoding of held-out answers with `drafter`'s trees (a CorpusLookupDrafter, deterministic
    children) of up to k nodes: a node is reached when its parent was accepted, and accepted when its token is the
    answer's next one. Returns corpus source → [depth][support][freq bin] P(accepted | reached) (the layout of
    corpus_tree.NodeAcceptance), each cell shrunk toward its bin's frequency by `prior_weight` pseudo-counts and made
    non-decreasing in frequency, so the most frequent continuation stays the first child."""
    from deepspec.decoding.drafters.corpus_tree import (
        FREQ_BINS,
        MAX_DEPTH_BUCKET,
        SUPPORT_EDGES,
        depth_bin,
        freq_bin,
        support_bin,
    )

    shape = (MAX_DEPTH_BUCKET, len(SUPPORT_EDGES), FREQ_BINS)
    reached: dict[str, np.ndarray] = {}
    accepted: dict[str, np.ndarray] = {}
    for context, answer in _replay(sequences):
        replay = DraftDriver(drafter, num_slots=1, max_tokens=len(context) + len(answer) + 1)
        replay.start(0, list(context))
        position = 0
        while position < len(answer):
            tree = drafter.draft_tree(replay.view, 0, k)
            accepted_nodes = {-1}  # the root, then every accepted node (siblings hold distinct tokens: one path)
            for i, node in enumerate(tree.nodes):
                if node.parent not in accepted_nodes:
                    continue  # never reached: its parent was rejected
                at = position + node.depth - 1
                hit = at < len(answer) and node.token == answer[at]
                key, depth, *rest = node.feature
                if rest:
                    support, f = rest
                    cell = (depth_bin(depth), support_bin(support), freq_bin(f))
                    reached.setdefault(key, np.zeros(shape))[cell] += 1
                    accepted.setdefault(key, np.zeros(shape))[cell] += hit
                if hit:
                    accepted_nodes.add(i)
            path = accepted_nodes
            committed = answer[position : position + len(path)]
            replay.commit([0], [committed])
            position += len(committed)
    centers = (np.arange(FREQ_BINS) + 0.5) / FREQ_BINS
    return {
        key: np.maximum.accumulate((accepted[key] + prior_weight * centers) / (reached[key] + prior_weight), axis=-1)
        .round(4)
        .tolist()
        for key in sorted(reached)
    }


def build_corpus(
    paths: list[Path],
    target,
    out: Path,
    *,
    max_match: int = 12,
    min_match: int = 1,
    num_held_out: int = 100,
    num_speculative_tokens: int = 7,
    tree_nodes: int = 16,
    max_len: int = 4096,
    drafting: dict | None = None,
    log=None,
) -> dict:
    """Tokenize, index all but the last `num_held_out` conversations, measure the drafter's per-source slot
    acceptance (chains of `num_speculative_tokens`) and tree-node acceptance (trees of `tree_nodes`) on those, and
    save; `drafting` (tree, sampled, max_fallbacks) becomes the drafter's defaults. Returns the summary also written
    into config.json."""
    from deepspec.decoding.drafters.corpus_lookup import CorpusLookupDrafter, save_corpus
    from deepspec.decoding.drafters.suffix_index import SuffixIndex

    log = log or (lambda line: None)
    stats = DataStats()
    sequences = load_sequences(paths, target, max_len, stats)
    if stats.num_malformed:
        log(f"skipped {stats.num_malformed} malformed rows (first: {stats.problems[0]})")
    num_held_out = min(num_held_out, len(sequences) // 10)
    indexed, held_out = sequences[: len(sequences) - num_held_out], sequences[len(sequences) - num_held_out :]
    tokens = corpus_tokens(indexed)
    log(f"indexing {len(tokens):,} tokens from {len(indexed)} conversations (max match {max_match})")
    index = SuffixIndex.build(tokens, max_match)
    slot_acceptance, node_acceptance = {}, {}
    if held_out:
        drafter = CorpusLookupDrafter(index, min_corpus_match=min_match)
        slot_acceptance = measure_slot_acceptance(drafter, held_out, num_speculative_tokens)
        log(
            f"slot acceptance measured on {len(held_out)} held-out conversations: "
            + "; ".join(f"{k} {v[0]:.2f}" for k, v in slot_acceptance.items())
        )
        drafter = CorpusLookupDrafter(index, min_corpus_match=min_match, slot_acceptance=slot_acceptance, tree=True)
        node_acceptance = measure_node_acceptance(drafter, held_out, tree_nodes)
        log(f"tree-node acceptance measured for {', '.join(node_acceptance)}")
    summary = {
        "num_conversations": len(indexed),
        "num_held_out": len(held_out),
        "num_malformed": stats.num_malformed,
        "data": [str(p) for p in paths],
        "node_acceptance": node_acceptance,
        "drafting": {"tree": False, "sampled": False, "max_fallbacks": 1, **(drafting or {})},
    }
    save_corpus(
        out, index, target.fingerprint(), min_corpus_match=min_match, slot_acceptance=slot_acceptance, extra=summary
    )
    summary = {key: value for key, value in summary.items() if key != "node_acceptance"}
    return {**summary, "num_tokens": len(index), "max_match": max_match, "min_corpus_match": min_match, "out": str(out)}
