"""Hybrid drafting: corpus lookup where its match is long, a neural draft elsewhere.

The two drafts fail in different places. Corpus lookup is nearly free and, when the sequence's recent words
match its own context (prompt lookup) or a long stretch of the target's earlier answers, its continuation is
accepted far more often than any small draft's guess; where the match is short it proposes little or nothing.
A neural draft proposes something everywhere, at the cost of its forward. The hybrid asks the corpus first, per
row: a row whose match is strong (prompt lookup found the words, or the corpus matched at least `min_match`
tokens) takes the corpus proposal; the other rows take the neural one. The default min_match 4 is the one
measured (2 prompts per eval set, greedy and temperature 1): it beat corpus lookup alone on two of the three sets in
both modes of sampling. At 3 matched tokens the corpus's first-slot acceptance (0.56) already passes the shipped
neural drafts' (~0.3), so 3 is the next value to measure.
When every row is strong the neural draft's propose is skipped entirely (it still hears every `commit`, so its
own state stays current). The corpus part reads the engine's batch state like any token-reading drafter; only the
neural part, which keeps a KV cache, hears commits and slot moves.

`mode="merge"` instead joins both proposals under one root for greedy rows of weak matches: the node budget
goes to the nodes of either tree with the highest survival, equal sibling tokens merged (tree.merge_trees, the
pruning every tree shares). Sampled rows never merge: whether a drawn node is kept must not depend on the token
drawn, and a merge by value would do exactly that, so they switch as above.

A hybrid is a draft directory whose config.json names its parts (paths relative to the directory):

    {"algo": "hybrid", "corpus": "../smollm2-135m-corpus", "neural": "../smollm2-135m-dspark",
     "min_match": 4, "mode": "switch", "corpus_options": {}, "neural_options": {"tree_branches": 4},
     "target": {...the parts' target fingerprint...}}

`save_hybrid` writes one; build_drafter, auto and eval load it like any draft directory.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from deepspec.decoding.batch_state import BatchView
from deepspec.decoding.drafter import Drafter, DraftSampling, KVDrafter, PaddedProposal, Proposal
from deepspec.decoding.tree import chain_parents, live_nodes, merge_trees
from deepspec.models.target import Target

if TYPE_CHECKING:
    from deepspec.decoding.drafters.corpus_lookup import CorpusLookupDrafter

#: `algo` in config.json of a hybrid draft directory
ALGO = "hybrid"
MODES = ("switch", "merge")


#: corpus tokens matched that make a row strong (the measured value; see the module docstring)
DEFAULT_MIN_MATCH = 4


class HybridDrafter(KVDrafter):
    name = ALGO

    def __init__(
        self, corpus: CorpusLookupDrafter, neural: Drafter, min_match: int = DEFAULT_MIN_MATCH, mode: str = "switch"
    ):
        """corpus: a drafter with `draft(view, slot, k) -> (tokens, source)` (CorpusLookupDrafter); neural: any
        drafter (its commit hooks are forwarded when it is a KVDrafter)."""
        if mode not in MODES:
            raise ValueError(f"hybrid mode must be one of {MODES}, got '{mode}'")
        if min_match < 1:
            raise ValueError(f"min_match must be >= 1, got {min_match}")
        if not callable(getattr(corpus, "draft", None)):
            raise ValueError(f"the hybrid's corpus part must be a corpus-lookup drafter, got '{corpus.name}'")
        self.corpus, self.neural = corpus, neural
        self.min_match, self.mode = min_match, mode
        self.feature_layers = tuple(neural.feature_layers)
        #: rounds per source, for reports and tests: how often each part drafted a row
        self.rows_drafted = {"corpus": 0, "neural": 0, "merged": 0}
        #: slot -> (sequence id, committed tokens, strong): the engine asks `costly_rows` and then `propose` in one
        #: round, and both need the same answer; the corpus lookup behind it is asked once per round
        self._strength: dict[int, tuple[int, int, bool]] = {}

    @property
    def tree(self) -> bool:
        """Whether either part proposes trees (what benchmark tables call the draft's shape)."""
        return bool(getattr(self.corpus, "tree", None)) or bool(getattr(self.neural, "tree", None))

    def use_session_memory(self, memory) -> None:
        self.corpus.use_session_memory(memory)

    def bind(self, target: Target, max_batch_size: int, max_seq_len: int) -> None:
        self.corpus.bind(target, max_batch_size, max_seq_len)
        self.neural.bind(target, max_batch_size, max_seq_len)
        self.vocab_size = target.vocab_size

    # the commit hooks reach the neural part alone: the corpus part reads the batch state
    def reset(self, slot: int, first_token: int) -> None:
        if isinstance(self.neural, KVDrafter):
            self.neural.reset(slot, first_token)

    def commit(self, slots, tokens, num_tokens, features) -> None:
        if isinstance(self.neural, KVDrafter):
            self.neural.commit(slots, tokens, num_tokens, features)

    def move_slot(self, src: int, dst: int) -> None:
        if isinstance(self.neural, KVDrafter):
            self.neural.move_slot(src, dst)

    def release(self, slot: int) -> None:
        if isinstance(self.neural, KVDrafter):
            self.neural.release(slot)

    def strong(self, view: BatchView, slot: int) -> bool:
        """Whether the corpus's match for this sequence is long enough to trust it over the neural draft (looked
        up once per slot and round: the answer depends only on the sequence's committed tokens)."""
        key = (view.sequence_id(slot), view.num_tokens(slot))
        known = self._strength.get(slot)
        if known is not None and known[:2] == key:
            return known[2]
        strong = self._look_up_strength(view, slot)
        self._strength[slot] = (*key, strong)
        return strong

    def _look_up_strength(self, view: BatchView, slot: int) -> bool:
        from deepspec.decoding.drafters.corpus_lookup import PROMPT_LOOKUP_SOURCE, corpus_source

        tokens, source = self.corpus.draft(view, slot, 1)
        if not tokens:
            return False
        if source == PROMPT_LOOKUP_SOURCE:
            return True
        # sources name the match length, capped where the acceptance table lumps long matches together
        matched, cap = int(source.rsplit("_", 1)[1]), int(corpus_source(1 << 20).rsplit("_", 1)[1])
        return matched >= min(self.min_match, cap)

    def costly_rows(self, view: BatchView, slots: list[int]) -> int:
        """The rows the neural part would draft (the corpus's own lookups cost next to nothing)."""
        return sum(not self.strong(view, s) for s in slots) if self.neural.costly_rows(view, slots) else 0

    def propose(self, view: BatchView, slots: list[int], k: int, sampling: DraftSampling) -> Proposal:
        strong = [self.strong(view, s) for s in slots]
        greedy = (sampling.temperature <= 0).tolist()
        merging = self.mode == "merge" and any(greedy)
        corpus = self.corpus.propose(view, slots, k, sampling) if any(strong) or merging else None
        if all(strong) and corpus is not None:
            self.rows_drafted["corpus"] += len(slots)
            return corpus
        # the rows are combined in the padded form (k wide) the tree functions take
        padded = corpus.padded(k) if corpus is not None else None
        neural = _on_host(self.neural.propose(view, slots, k, sampling).padded(k))
        merged = [
            not s and g and padded is not None and self.mode == "merge" and int(padded.num_tokens[i]) > 0
            for i, (s, g) in enumerate(zip(strong, greedy))
        ]
        self.rows_drafted["corpus"] += sum(strong)
        self.rows_drafted["merged"] += sum(merged)
        self.rows_drafted["neural"] += len(slots) - sum(strong) - sum(merged)
        both = merge_trees(_as_tree(padded), _as_tree(neural), k) if any(merged) and padded is not None else None
        owner = torch.tensor([1 if s else 2 if m else 0 for s, m in zip(strong, merged)])
        return _rows_of([neural, padded, both], owner, k, self._vocab(padded, neural)).ragged()

    def _vocab(self, *proposals: PaddedProposal | None) -> int:
        for p in proposals:
            if p is not None and p.probs is not None:
                return p.probs.shape[-1]
        return getattr(self, "vocab_size", 0)


def _on_host(p: PaddedProposal) -> PaddedProposal:
    """The proposal's tokens, parents and survival read back in one go: the rows are combined on the host."""
    return PaddedProposal(
        p.tokens.cpu(),
        p.num_tokens,
        p.probs,
        None if p.survival is None else p.survival.cpu(),
        None if p.parents is None else p.parents.cpu(),
    )


def _as_tree(p: PaddedProposal) -> PaddedProposal:
    """A proposal with its parents spelled out (a chain's: -1, 0, 1, ...)."""
    B, k = p.tokens.shape
    return PaddedProposal(
        p.tokens, p.num_tokens, p.probs, p.survival, p.parents if p.parents is not None else chain_parents(B, k)
    )


def _rows_of(parts: list[PaddedProposal | None], owner: torch.Tensor, k: int, vocab: int) -> PaddedProposal:
    """Row b of parts[owner[b]] for every row b, as one proposal of width k (host tensors but probs). Survival where
    every row's part has it; probs where some row's part has them, one-hot in the other rows (deterministic
    drafts); parents None when every row is a chain."""
    used = [(p, owner == i) for i, p in enumerate(parts) if p is not None and bool((owner == i).any())]
    B = len(owner)
    tokens, parents = torch.zeros(B, k, dtype=torch.long), chain_parents(B, k)
    num = torch.zeros(B, dtype=torch.long)
    survival = torch.zeros(B, k) if all(p.survival is not None for p, _ in used) else None
    for p, rows in used:
        tokens = torch.where(rows[:, None], p.tokens[:, :k], tokens)
        num = torch.where(rows, p.num_tokens, num)
        parents = torch.where(rows[:, None], _as_tree(p).tree_parents()[:, :k], parents)
        if survival is not None and p.survival is not None:
            survival = torch.where(rows[:, None], p.survival[:, :k].float(), survival)
    live = live_nodes(num, k)
    probs = None
    with_probs = [(p.probs, rows) for p, rows in used if p.probs is not None]
    if with_probs:
        device = with_probs[0][0].device
        probs = torch.zeros(B, k, vocab, device=device).scatter_(2, tokens[..., None].to(device), 1.0)
        for part_probs, rows in with_probs:
            probs = torch.where(rows.to(device)[:, None, None], part_probs[:, :k].to(device), probs)
        probs = probs * live.to(device)[..., None]
    chain = bool(((parents == chain_parents(B, k)) | ~live).all())
    return PaddedProposal(tokens, num, probs, survival, None if chain else parents)


def save_hybrid(
    path: str | Path,
    corpus: str | Path,
    neural: str | Path,
    *,
    min_match: int = DEFAULT_MIN_MATCH,
    mode: str = "switch",
    corpus_options: dict | None = None,
    neural_options: dict | None = None,
) -> Path:
    """Write a hybrid draft directory naming its two parts (stored relative to it); the target fingerprint is the
    neural part's, so `auto` and shipped_drafts see it like any draft for that target."""
    from deepspec.models.drafts import read_checkpoint_header

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = {
        "algo": ALGO,
        "corpus": _relative(corpus, path),
        "neural": _relative(neural, path),
        "min_match": min_match,
        "mode": mode,
        "corpus_options": corpus_options or {},
        "neural_options": neural_options or {},
        "target": read_checkpoint_header(neural).get("target", {}),
    }
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return path


def _under(p: Path, root: Path) -> bool:
    try:
        p.relative_to(root)
        return True
    except ValueError:
        return False


def _relative(part: str | Path, hybrid_dir: Path) -> str:
    """A part's path as config.json stores it: relative to the hybrid directory when they share a parent."""
    part, base = Path(part).resolve(), hybrid_dir.resolve()
    if _under(part, base.parent):
        return "../" + part.relative_to(base.parent).as_posix()
    return str(part)


def load_drafter(
    path: Path, header: dict, target: Target, *, load_part: Callable[..., Drafter], **options
) -> HybridDrafter:
    """The registry's loader for `hybrid` directories: load both parts (each checked against the target) with
    their options from config.json; `options` override min_match and mode, and `corpus_options` /
    `neural_options` (dicts) update the parts'. `load_part(directory, target, **options)` is the registry's
    loader of any draft directory, passed in because the registry imports this module."""
    from deepspec.models.drafts import DraftCheckpointError

    parts = {}
    for part in ("corpus", "neural"):
        where = header.get(part)
        if not isinstance(where, str):
            raise DraftCheckpointError(f"{path}/config.json: a hybrid draft names its '{part}' draft directory")
        part_dir = (Path(path) / where).resolve()
        if not (part_dir / "config.json").is_file():
            raise DraftCheckpointError(f"{path}/config.json: its {part} part {part_dir} is not a draft directory")
        part_options = {**header.get(f"{part}_options", {}), **options.pop(f"{part}_options", {})}
        parts[part] = load_part(part_dir, target, **part_options)
    options.setdefault("min_match", int(header.get("min_match", DEFAULT_MIN_MATCH)))
    options.setdefault("mode", header.get("mode", "switch"))
    try:
        return HybridDrafter(parts["corpus"], parts["neural"], **options)
    except (TypeError, ValueError) as exc:
        raise DraftCheckpointError(f"{path}: {exc}") from None
