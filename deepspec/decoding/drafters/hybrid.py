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
When every row is strong the neural draft's propose is skipped entirely (it still hears every `extend`, so its
own state stays current).

`mode="merge"` instead joins both proposals under one root for greedy rows of weak matches: the node budget
goes to the nodes of either tree with the highest survival, equal sibling tokens merged. Sampled rows never
merge: whether a drawn node is kept must not depend on the token drawn, and a merge by value would do exactly
that, so they switch as above.

A hybrid is a draft directory whose config.json names its parts (paths relative to the directory):

    {"algo": "hybrid", "corpus": "../smollm2-135m-corpus", "neural": "../smollm2-135m-dspark",
     "min_match": 4, "mode": "switch", "corpus_options": {}, "neural_options": {"tree_branches": 4},
     "target": {...the parts' target fingerprint...}}

`save_hybrid` writes one; build_drafter, auto and eval load it like any draft directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch

from deepspec.decoding.drafter import DraftSampling, Drafter, Proposal
from deepspec.models.target import Target

#: `algo` in config.json of a hybrid draft directory
ALGO = "hybrid"
MODES = ("switch", "merge")


#: corpus tokens matched that make a row strong (the measured value; see the module docstring)
DEFAULT_MIN_MATCH = 4


class HybridDrafter(Drafter):
    name = ALGO

    def __init__(self, corpus: Drafter, neural: Drafter, min_match: int = DEFAULT_MIN_MATCH, mode: str = "switch"):
        """corpus: a drafter with `draft(slot, k) -> (tokens, source)` (CorpusLookupDrafter); neural: any drafter."""
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

    @property
    def tree(self) -> bool:
        """Whether either part proposes trees (what benchmark tables call the draft's shape)."""
        return bool(getattr(self.corpus, "tree", None)) or bool(getattr(self.neural, "tree", None))

    def bind(self, target: Target, max_batch_size: int, max_seq_len: int) -> None:
        self.corpus.bind(target, max_batch_size, max_seq_len)
        self.neural.bind(target, max_batch_size, max_seq_len)
        self.vocab_size = target.vocab_size

    def reset(self, slot: int, first_token: int) -> None:
        self.corpus.reset(slot, first_token)
        self.neural.reset(slot, first_token)

    def extend(self, slots, tokens, num_tokens, features) -> None:
        self.corpus.extend(slots, tokens, num_tokens, None)
        self.neural.extend(slots, tokens, num_tokens, features)

    def move_slot(self, src: int, dst: int) -> None:
        self.corpus.move_slot(src, dst)
        self.neural.move_slot(src, dst)

    def release(self, slot: int) -> None:
        self.corpus.release(slot)
        self.neural.release(slot)

    def strong(self, slot: int) -> bool:
        """Whether the corpus's match for this sequence is long enough to trust it over the neural draft."""
        from deepspec.decoding.drafters.corpus_lookup import PROMPT_LOOKUP_SOURCE, corpus_source

        tokens, source = self.corpus.draft(slot, 1)
        if not tokens:
            return False
        if source == PROMPT_LOOKUP_SOURCE:
            return True
        # sources name the match length, capped where the acceptance table lumps long matches together
        matched, cap = int(source.rsplit("_", 1)[1]), int(corpus_source(1 << 20).rsplit("_", 1)[1])
        return matched >= min(self.min_match, cap)

    def propose(self, slots: list[int], k: int, sampling: DraftSampling) -> Proposal:
        strong = [self.strong(s) for s in slots]
        temps = sampling.temperature.tolist()
        merging = self.mode == "merge" and min(temps) <= 0
        corpus = self.corpus.propose(slots, k, sampling) if any(strong) or merging else None
        need_neural = [i for i, s in enumerate(strong) if not s or (self.mode == "merge" and temps[i] <= 0)]
        if not need_neural:
            self.rows_drafted["corpus"] += len(slots)
            return corpus
        neural = _on_host(self.neural.propose(slots, k, sampling))
        rows = []
        for i in range(len(slots)):
            a = _row(corpus, i, k) if corpus is not None else ([], [], None, None)
            b = _row(neural, i, k)
            if strong[i]:
                rows.append(a)
                self.rows_drafted["corpus"] += 1
            elif self.mode == "merge" and temps[i] <= 0 and a[0]:
                rows.append(_merge(a, b, k))
                self.rows_drafted["merged"] += 1
            else:
                rows.append(b)
                self.rows_drafted["neural"] += 1
        return _stack(rows, k, self._vocab(corpus, neural))

    def _vocab(self, *proposals: Proposal | None) -> int:
        for p in proposals:
            if p is not None and p.probs is not None:
                return p.probs.shape[-1]
        return getattr(self, "vocab_size", 0)


def _on_host(p: Proposal) -> Proposal:
    """The proposal's tokens, parents and survival read back in one go: the rows are combined on the host."""
    return Proposal(p.tokens.cpu(), p.num_tokens, p.probs, None if p.survival is None else p.survival.cpu(),
                    None if p.parents is None else p.parents.cpu())


# one row of a proposal as plain lists: (tokens, parents, survival | None, q rows | None), q None per node = one-hot
Row = tuple[list[int], list[int], list[float] | None, list[torch.Tensor | None] | None]


def _row(p: Proposal, i: int, k: int) -> Row:
    n = int(p.num_tokens[i])
    tokens = p.tokens[i, :n].tolist()
    parents = p.parents[i, :n].tolist() if p.parents is not None else list(range(-1, n - 1))
    survival = p.survival[i, :n].tolist() if p.survival is not None else None
    qs = None
    if p.probs is not None:
        qs = []
        for j in range(n):
            row = p.probs[i, j]
            qs.append(None if float(row[tokens[j]]) >= 1.0 else row)  # a one-hot row is a chosen token
    return tokens, parents, survival, qs


def _merge(a: Row, b: Row, k: int) -> Row:
    """Greedy rows: both trees under one root, equal sibling tokens merged (keeping the higher survival), then the
    k highest-survival nodes (parents first). Without survival on either side the corpus's nodes come first."""
    tokens, parents, survival = [], [], []
    key_of: dict[tuple[int, int], int] = {}  # (merged parent, token) → merged node
    order: list[float] = []

    def add(row: Row, rank_offset: float) -> None:
        t, par, surv, _ = row
        mapped: list[int] = []
        for j, tok in enumerate(t):
            parent = -1 if par[j] < 0 else mapped[par[j]]
            s = surv[j] if surv is not None else None
            key = (parent, tok)
            if key in key_of:
                node = key_of[key]
                if s is not None and (survival[node] is None or s > survival[node]):
                    survival[node] = s
            else:
                node = len(tokens)
                key_of[key] = node
                tokens.append(tok)
                parents.append(parent)
                survival.append(s)
                order.append(rank_offset + j)
            mapped.append(node)

    add(a, 0.0)
    add(b, 1e6)
    if any(s is None for s in survival):  # no common scale: the corpus's nodes first, then the neural ones
        score = [-o for o in order]
    else:
        score = survival
    ranked = sorted(range(len(tokens)), key=lambda i: -score[i])
    kept, chosen = [], set()
    for i in ranked:
        if len(kept) == k:
            break
        if parents[i] < 0 or parents[i] in chosen:
            kept.append(i)
            chosen.add(i)
    kept.sort()  # merged indices are topological already
    index = {old: new for new, old in enumerate(kept)}
    out_survival = None if any(s is None for s in survival) else [survival[i] for i in kept]
    return ([tokens[i] for i in kept], [-1 if parents[i] < 0 else index[parents[i]] for i in kept], out_survival,
            None)


def _stack(rows: list[Row], k: int, vocab: int) -> Proposal:
    B = len(rows)
    tokens = torch.zeros(B, k, dtype=torch.long)
    parents = torch.full((B, k), -1, dtype=torch.long)
    num = torch.tensor([len(r[0]) for r in rows], dtype=torch.long)
    chain = True
    for b, (t, par, _, _) in enumerate(rows):
        if t:
            tokens[b, : len(t)] = torch.tensor(t)
            parents[b, : len(t)] = torch.tensor(par)
        chain = chain and par == list(range(-1, len(t) - 1))
    survival = None
    if all(r[2] is not None for r in rows):
        survival = torch.zeros(B, k)
        for b, r in enumerate(rows):
            survival[b, : len(r[2])] = torch.tensor(r[2], dtype=torch.float32)
    probs = None
    if any(r[3] is not None and any(q is not None for q in r[3]) for r in rows):
        probs = torch.zeros(B, k, vocab)
        for b, (t, _, _, qs) in enumerate(rows):
            for j, tok in enumerate(t):
                q = qs[j] if qs is not None else None
                if q is None:
                    probs[b, j, tok] = 1.0
                else:
                    probs[b, j] = q.to(probs.dtype)
    return Proposal(tokens, num, probs, survival, None if chain else parents)


def save_hybrid(path: str | Path, corpus: str | Path, neural: str | Path, *, min_match: int = DEFAULT_MIN_MATCH,
                mode: str = "switch", corpus_options: dict | None = None, neural_options: dict | None = None) -> Path:
    """Write a hybrid draft directory naming its two parts (stored relative to it); the target fingerprint is the
    neural part's, so `auto` and shipped_drafts see it like any draft for that target."""
    from deepspec.models.drafts import read_checkpoint_header

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = {"algo": ALGO, "corpus": _relative(corpus, path), "neural": _relative(neural, path),
              "min_match": min_match, "mode": mode, "corpus_options": corpus_options or {},
              "neural_options": neural_options or {}, "target": read_checkpoint_header(neural).get("target", {})}
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


def load_drafter(path: Path, header: dict, target: Target, *, load_part: Callable[..., Drafter],
                 **options) -> HybridDrafter:
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
