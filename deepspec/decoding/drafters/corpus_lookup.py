"""Corpus lookup: prompt lookup first, then what the target itself wrote after the same words in other answers.

Prompt lookup only finds text the sequence already holds. A small target answers alike across prompts ("Let's
break this down step by step", `def`, `return`, the closing of a code fence), so its own earlier answers — the
conversations `python -m training prepare` regenerated — predict much of what prompt lookup cannot. The corpus is
searched through a SuffixIndex (longest suffix match, most frequent continuation); nothing is trained and drafting
costs well under a millisecond, which is what makes it pay on a CPU where a neural draft's own forward does not.

The index is static: served outputs are never added, so one user's text never drafts another's.

With `tree=True` it proposes token trees instead of one chain (corpus_tree.py): where the target's answers
disagree on what comes next, it drafts each likely branch, ranked by calibrated acceptance estimates, and prompt
lookup's chain is one branch of that tree.

A corpus-lookup "draft" is a checkpoint directory like the neural ones: config.json (algo `corpus-lookup`, the
target fingerprint, sizes, the acceptance tables measured at build time — `slot_acceptance` for chains,
`node_acceptance` for trees — and `drafting`, the drafter's default options) and corpus.safetensors (`tokens`:
uint16 with SEPARATOR written as 0xFFFF when every id fits, else int32); `python -m training corpus` builds it.
The suffix array is rebuilt at load (~1-2 s for 1M tokens on one core) instead of stored: it is twice the size of
uint16 tokens and a function of them. A directory without the newer keys or with a stored int32 `suffix_array`
still loads (chains).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import torch

from deepspec.decoding.batch_state import BatchView
from deepspec.decoding.drafter import DraftSampling, Proposal, cumulative_counts
from deepspec.decoding.drafters.corpus_tree import PROMPT_LOOKUP_SOURCE, NodeAcceptance, TreeBuilder, corpus_source
from deepspec.decoding.drafters.prompt_lookup import PromptLookupDrafter
from deepspec.decoding.drafters.suffix_index import SEPARATOR, SuffixIndex
from deepspec.models.target import Target

#: `algo` in config.json of a corpus-lookup draft directory
ALGO = "corpus-lookup"
CORPUS_FILE = "corpus.safetensors"
#: SEPARATOR in uint16-stored tokens (no token id of a vocabulary of < 65,535 takes it)
UINT16_SEPARATOR = 0xFFFF


class CorpusLookupDrafter(PromptLookupDrafter):
    """Chains (`tree=False`: prompt lookup, else the corpus's greedy continuation) or trees (corpus_tree.py).

    `sampled`: rows sampled at temperature > 0 draw their corpus children from the continuation frequencies and
    carry them as q (False: deterministic top-frequency children, one-hot q, for every row). `max_fallbacks`:
    shorter corpus matches that may add root children besides the longest one."""

    name = ALGO

    def __init__(
        self,
        index: SuffixIndex,
        min_ngram: int = 2,
        max_ngram: int = 4,
        min_corpus_match: int = 1,
        slot_acceptance: dict[str, list[float]] | None = None,
        node_acceptance: dict | None = None,
        tree: bool = False,
        sampled: bool = False,
        max_fallbacks: int = 1,
        min_freq: float = 0.0,
        vocab_size: int | None = None,
    ):
        super().__init__(min_ngram, max_ngram)
        if min_corpus_match < 1:
            raise ValueError(f"min_corpus_match must be >= 1, got {min_corpus_match}")
        if max_fallbacks < 0:
            raise ValueError(f"max_fallbacks must be >= 0, got {max_fallbacks}")
        self.index = index
        self.min_corpus_match = min_corpus_match
        #: source → P(slot j accepted | slots before it accepted), measured on held-out answers when the corpus
        #: was built (training/corpus.py); turns each draft into the survival estimate the verify budget wants
        self.slot_acceptance = slot_acceptance or {}
        #: per-node acceptance of tree children (corpus_tree.NodeAcceptance), measured the same way
        self.acceptance = NodeAcceptance(node_acceptance, self.slot_acceptance)
        self.tree, self.sampled, self.max_fallbacks, self.min_freq = tree, sampled, max_fallbacks, min_freq
        self.vocab_size = vocab_size

    def bind(self, target: Target, max_batch_size: int, max_seq_len: int) -> None:
        self.vocab_size = target.vocab_size

    def draft(self, view: BatchView, slot: int, k: int) -> tuple[list[int], str]:
        """Up to k tokens for one sequence and where they came from (PROMPT_LOOKUP_SOURCE or corpus_source(m))."""
        # in-context matches first: measured better than taking whichever match is longer
        tokens = self.lookup(view, slot, k)
        if tokens:
            return tokens, PROMPT_LOOKUP_SOURCE
        matched, positions = self.index.longest_match(self._context(view, slot))
        if matched < self.min_corpus_match:
            return [], corpus_source(matched)
        return self.index.continuation(positions, k)[0], corpus_source(matched)

    def draft_tree(
        self, view: BatchView, slot: int, k: int, sampled: bool = False, generator: torch.Generator | None = None
    ) -> TreeBuilder:
        """A tree of up to k nodes for one sequence (corpus_tree.TreeBuilder, nodes in topological order)."""
        levels = self.index.matches(self._context(view, slot), self.min_corpus_match)[: 1 + self.max_fallbacks]
        builder = TreeBuilder(
            self.index, self.acceptance, k, sampled=sampled, generator=generator, min_freq=self.min_freq
        )
        return builder.build(self.lookup(view, slot, k), levels)

    def _context(self, view: BatchView, slot: int) -> list[int]:
        """The sequence's last tokens, as many as a corpus match can use."""
        return view.tokens(slot)[-self.index.max_match :].tolist()

    def propose(self, view: BatchView, slots: list[int], k: int, sampling: DraftSampling) -> Proposal:
        if self.tree:
            return self._propose_trees(view, slots, k, sampling)
        drafts, survival = [], [] if self.slot_acceptance else None
        for slot in slots:
            draft, source = self.draft(view, slot, k)
            drafts.append(draft)
            if survival is not None and draft:
                rates = self.slot_acceptance.get(source)
                if rates is None or len(rates) < len(draft):
                    survival = None  # a source the table never saw: the engine's per-sequence record decides
                else:
                    survival.append(torch.tensor(rates[: len(draft)]).cumprod(0))
        if survival is not None:
            survival = torch.cat(survival) if survival else torch.zeros(0)
        return Proposal(
            torch.tensor([t for d in drafts for t in d], dtype=torch.long), cumulative_counts(drafts), None, survival
        )

    def _propose_trees(self, view: BatchView, slots: list[int], k: int, sampling: DraftSampling) -> Proposal:
        trees = []
        for row, slot in enumerate(slots):
            sampled = self.sampled and float(sampling.temperature[row]) > 0
            trees.append(self.draft_tree(view, slot, k, sampled, sampling.generators[row] if sampled else None))
        tokens = torch.tensor([t for tree in trees for t in tree.tokens()], dtype=torch.long)
        probs = None
        if any(node.q is not None for tree in trees for node in tree.nodes):
            # unbound (tests): wide enough for every id the corpus and these trees hold
            vocab = self.vocab_size or max([int(self.index.tokens.max()) + 1] + [int(tokens.max()) + 1])
            probs = _node_probs(trees, vocab)
        return Proposal(
            tokens,
            cumulative_counts([tree.nodes for tree in trees]),
            probs,
            torch.tensor([s for tree in trees for s in tree.survival()], dtype=torch.float32),
            torch.tensor([p for tree in trees for p in tree.parents()], dtype=torch.long),
        )


def _node_probs(trees: list, vocab: int) -> torch.Tensor:
    """[N, vocab] each node's q, the trees' nodes back to back: the distribution a sampled node was drawn from,
    one-hot at a chosen one; written with one index_put from the nodes' (node, token, probability) entries."""
    entries, at = [], 0
    for tree in trees:
        for node in tree.nodes:
            ids, p = (np.array([node.token]), np.ones(1)) if node.q is None else node.q
            entries.append((np.full(ids.size, at), ids, p))
            at += 1
    nodes, ids, p = (torch.from_numpy(np.concatenate(column)) for column in zip(*entries))
    return torch.zeros(at, vocab).index_put_((nodes.long(), ids.long()), p.float())


def save_corpus(
    path: str | Path,
    index: SuffixIndex,
    target_fingerprint: dict,
    *,
    min_corpus_match: int = 1,
    slot_acceptance: dict[str, list[float]] | None = None,
    extra: dict | None = None,
) -> Path:
    """Write a corpus-lookup draft directory; `min_corpus_match` becomes the drafter's default."""
    from safetensors.numpy import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file({"tokens": stored_tokens(index.tokens)}, str(path / CORPUS_FILE))
    config = {
        "algo": ALGO,
        "max_match": index.max_match,
        "min_corpus_match": min_corpus_match,
        "num_tokens": len(index),
        "target": target_fingerprint,
        "slot_acceptance": slot_acceptance or {},
        **(extra or {}),
    }
    (path / "config.json").write_text(_dumps(config) + "\n")
    return path


def _dumps(config: dict) -> str:
    """Indented JSON whose lists of numbers (the acceptance tables) stay on one line each."""
    text = json.dumps(config, indent=2)
    return re.sub(r"\[[\d.eE+\-,\s]*\]", lambda m: json.dumps(json.loads(m.group(0))), text)


def load_drafter(path: Path, header: dict, target: Target, **options) -> CorpusLookupDrafter:
    """The registry's loader for `corpus-lookup` directories: check the target fingerprint, read the index, and take
    min_corpus_match, the acceptance tables and the `drafting` defaults from config.json unless `options` set them."""
    from deepspec.models.drafts import DraftCheckpointError, check_target

    check_target(header.get("target", {}), target, where=f"corpus {path}")
    try:
        index = load_corpus_index(path, int(header["max_match"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise DraftCheckpointError(str(exc)) from None
    options.setdefault("min_corpus_match", int(header.get("min_corpus_match", 1)))
    options.setdefault("slot_acceptance", header.get("slot_acceptance"))
    options.setdefault("node_acceptance", header.get("node_acceptance"))
    try:
        NodeAcceptance(options["node_acceptance"])
    except (TypeError, ValueError) as exc:
        raise DraftCheckpointError(
            f"{path / 'config.json'}: {exc}; rebuild it with `python -m training corpus`"
        ) from None
    for key in ("tree", "sampled", "max_fallbacks"):
        if key in header.get("drafting", {}):
            options.setdefault(key, header["drafting"][key])
    return CorpusLookupDrafter(index, **options)


def stored_tokens(tokens: np.ndarray) -> np.ndarray:
    """The corpus tokens as corpus.safetensors holds them: uint16 (SEPARATOR as UINT16_SEPARATOR) when every id is
    below it, which halves the file, else int32 as they are."""
    tokens = np.asarray(tokens, dtype=np.int32)
    if len(tokens) and (int(tokens.max()) >= UINT16_SEPARATOR or int(tokens.min()) < SEPARATOR):
        return np.ascontiguousarray(tokens)
    return np.where(tokens == SEPARATOR, UINT16_SEPARATOR, tokens).astype(np.uint16)


def read_stored_tokens(stored: np.ndarray) -> np.ndarray:
    """[N] int32 tokens (SEPARATOR restored) from what stored_tokens wrote, or from an int32 file."""
    if stored.dtype == np.uint16:
        return np.where(stored == UINT16_SEPARATOR, SEPARATOR, stored.astype(np.int32)).astype(np.int32)
    if stored.dtype != np.int32:
        raise ValueError(f"tokens are {stored.dtype}; a corpus index stores uint16 or int32")
    return stored


def load_corpus_index(path: str | Path, max_match: int) -> SuffixIndex:
    """Read corpus.safetensors; a missing, truncated or inconsistent file raises ValueError naming it."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    file = Path(path) / CORPUS_FILE
    try:
        arrays = load_file(str(file))
        tokens = read_stored_tokens(arrays["tokens"])
        if "suffix_array" not in arrays:
            return SuffixIndex.build(tokens, max_match)
        return SuffixIndex(tokens, arrays["suffix_array"], max_match)
    except (SafetensorError, OSError, KeyError, ValueError) as exc:
        raise ValueError(
            f"{file}: cannot read the corpus index ({exc}); rebuild it with `python -m training corpus`"
        ) from None
