"""Corpus trees: where the target's earlier answers disagree on what comes next, draft every likely branch.

A chain wastes the verify pass whenever its first guess is wrong; a suffix match usually has a few continuations
with real frequency ("The answer is" → " 4" / " 5" / " $"), so the drafter spends its node budget k on a tree
(SuffixDecoding, Oliaro et al. 2024): best-first expansion, each candidate child scored by its estimated
probability of being reached and accepted — the parent's survival times the calibrated acceptance of the child's
source. The sources of a node's children:

- prompt lookup (the sequence's own earlier text): one deterministic child per node along its match, calibrated by
  depth (`prompt_lookup` in the slot-acceptance table: in-context matches were measured more reliable);
- the corpus: the occurrences of the context's longest suffix match (and shorter matches as fallbacks, which add
  continuations the longer match never saw), whose next-token counts give each child its frequency f; calibrated
  by match length, depth, number of occurrences and f (`NodeAcceptance`, measured by training/corpus.py).

Two ways to pick a node's corpus children:

- deterministic (greedy rows, and sampled rows when `sampled=False`): the most frequent tokens not yet children,
  one-hot q. Exact at any temperature; distinct siblings cover the target's mass on each of them.
- sampled (`sampled=True`, temperature > 0): each child is drawn from the continuation frequencies restricted to
  tokens that are not yet children of that node (recursive rejection sampling without replacement), and carries
  that distribution as its q, so verification accepts by p/q. A node's score must not depend on its own drawn
  token, or keeping it would bias the draw: it is computed before the draw (from the best remaining frequency),
  siblings' scores strictly decrease in index order and every child scores below its parent, so best-first order
  and the engine's top-survival cut only ever keep a prefix of a node's draws.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from deepspec.decoding.drafters.suffix_index import SuffixIndex

#: source key of a deterministic child from the sequence's own context
PROMPT_LOOKUP_SOURCE = "prompt_lookup"
#: corpus matches of this many tokens or more share one acceptance record
MAX_MATCH_BUCKET = 6
#: frequency bins of the node acceptance table (f in [0, 1])
FREQ_BINS = 10
#: occurrence counts that open a new support bin: 1, 2-3, 4-15, 16+
SUPPORT_EDGES = (1, 2, 4, 16)
#: depths with their own acceptance record; deeper nodes share the last
MAX_DEPTH_BUCKET = 8
#: continuations a node keeps per match level (most frequent first); sampled q is this truncated distribution
MAX_CHILDREN = 32
#: a child's acceptance estimate never reaches 1, so survival strictly decreases along every path
MAX_RATE = 0.999
#: sampled siblings' scores shrink at least by this factor in index order (strictly decreasing)
SIBLING_DECAY = 0.999


def corpus_source(matched: int) -> str:
    """The acceptance-table key of a corpus draft whose context matched `matched` tokens."""
    return f"corpus_{min(matched, MAX_MATCH_BUCKET)}"


def freq_bin(f: float) -> int:
    return min(int(f * FREQ_BINS), FREQ_BINS - 1)


def support_bin(n: int) -> int:
    return max(0, sum(n >= edge for edge in SUPPORT_EDGES) - 1)


def depth_bin(depth: int) -> int:
    """depth >= 1 (a child of the root) → row of the table."""
    return min(depth, MAX_DEPTH_BUCKET) - 1


class NodeAcceptance:
    """P(a child is accepted | its parent was), by source.

    corpus keys: [depth][support][freq bin] tables measured on held-out answers (training/corpus.py); a key or
    cell never measured reads as the frequency itself. prompt lookup: P(slot j accepted | slots before accepted)
    from the chain table (`slot_acceptance`), default 0.7."""

    def __init__(self, node_acceptance: dict | None = None, slot_acceptance: dict | None = None):
        self.tables = {key: np.asarray(value, dtype=np.float64) for key, value in (node_acceptance or {}).items()}
        for key, table in self.tables.items():
            if table.shape != (MAX_DEPTH_BUCKET, len(SUPPORT_EDGES), FREQ_BINS):
                raise ValueError(
                    f"node acceptance table {key} has shape {table.shape}, want "
                    f"{(MAX_DEPTH_BUCKET, len(SUPPORT_EDGES), FREQ_BINS)}"
                )
        self.prompt_lookup = list((slot_acceptance or {}).get(PROMPT_LOOKUP_SOURCE) or [])

    def corpus(self, key: str, depth: int, support: int, f: float) -> float:
        table = self.tables.get(key)
        rate = f if table is None else float(table[depth_bin(depth), support_bin(support), freq_bin(f)])
        return min(rate, MAX_RATE)

    def in_context(self, depth: int) -> float:
        rates = self.prompt_lookup
        rate = rates[min(depth, len(rates)) - 1] if rates else 0.7
        return min(rate, MAX_RATE)


@dataclass
class _CorpusChildren:
    """A node's corpus continuations from one match level."""

    key: str
    positions: np.ndarray  # occurrences whose next token follows this node
    tokens: list[int]  # most frequent first, at most MAX_CHILDREN
    counts: list[int]
    total: int  # occurrences voted (ended answers included)


@dataclass
class _Node:
    token: int
    parent: int
    depth: int
    survival: float
    q: tuple[np.ndarray, np.ndarray] | None = None  # (tokens, probs) this node was drawn from; None = one-hot
    #: prompt-lookup continuation after this node (deterministic), [] = none
    in_context: list[int] = field(default_factory=list)
    corpus: list[_CorpusChildren] = field(default_factory=list)
    children: dict[int, int] = field(default_factory=dict)  # token → node index
    last_child_score: float = float("inf")
    feature: tuple | None = None  # (key, depth, support, f) the score came from, for calibration


ROOT = -1


class TreeBuilder:
    """One row's tree: nodes in creation order (parents before children, siblings in score order)."""

    def __init__(
        self,
        index: SuffixIndex,
        acceptance: NodeAcceptance,
        budget: int,
        *,
        sampled: bool = False,
        generator: torch.Generator | None = None,
        min_freq: float = 0.0,
    ):
        self.index, self.acceptance, self.budget = index, acceptance, budget
        self.sampled, self.generator, self.min_freq = sampled, generator, min_freq
        self.root = _Node(token=-1, parent=ROOT, depth=0, survival=1.0)
        self.nodes: list[_Node] = []

    def _node(self, i: int) -> _Node:
        return self.root if i == ROOT else self.nodes[i]

    def _corpus_children(self, key: str, positions: np.ndarray) -> list[_CorpusChildren]:
        tokens, counts, total = self.index.next_tokens(positions)
        if not tokens.size:
            return []
        return [_CorpusChildren(key, positions, tokens[:MAX_CHILDREN].tolist(), counts[:MAX_CHILDREN].tolist(), total)]

    def build(self, in_context: list[int], levels: list[tuple[int, np.ndarray]]) -> TreeBuilder:
        """in_context: the prompt-lookup chain ([] = none); levels: corpus matches, longest first."""
        self.root.in_context = list(in_context)
        for matched, positions in levels:
            self.root.corpus += self._corpus_children(corpus_source(matched), positions)
        heap: list[tuple[float, int, int]] = []
        counter = 0

        def push(i: int) -> None:
            nonlocal counter
            best = self._next_child(self._node(i))
            if best is not None:
                heapq.heappush(heap, (-best[0], counter, i))
                counter += 1

        push(ROOT)
        while heap and len(self.nodes) < self.budget:
            _, _, i = heapq.heappop(heap)
            parent = self._node(i)
            choice = self._next_child(parent)  # unchanged since pushed: a node's state changes only when popped
            if choice is None:
                continue
            self._add_child(i, parent, *choice)
            push(i)
            push(len(self.nodes) - 1)
        return self

    def _next_child(self, node: _Node) -> tuple[float, Literal["context"] | int, tuple] | None:
        """(score, source, feature) of the node's best next child, decided before any token is drawn; None when
        no source has a child left. The source is "context" or the corpus level; the feature the acceptance key."""
        best: tuple[float, Literal["context"] | int, tuple] | None = None
        if node.in_context and node.in_context[0] not in node.children:
            rate = self.acceptance.in_context(node.depth + 1)
            best = (node.survival * rate, "context", (PROMPT_LOOKUP_SOURCE, node.depth + 1))
        for level, children in enumerate(node.corpus):
            f = self._remaining_top(node, children)
            if f is None or f < self.min_freq:
                continue
            rate = self.acceptance.corpus(children.key, node.depth + 1, children.total, f)
            score = node.survival * rate
            if best is None or score > best[0]:
                best = (score, level, (children.key, node.depth + 1, children.total, f))
        if best is None or best[0] <= 0:
            return None
        if self.sampled:
            best = (min(best[0], node.last_child_score * SIBLING_DECAY), best[1], best[2])
        return best

    @staticmethod
    def _remaining_top(node: _Node, children: _CorpusChildren) -> float | None:
        """Frequency of the most frequent continuation that is not yet a child."""
        for token, count in zip(children.tokens, children.counts):
            if token not in node.children:
                return count / children.total
        return None

    def _add_child(self, i: int, parent: _Node, score: float, source: Literal["context"] | int, feature: tuple) -> None:
        q = None
        if source == "context":
            token = parent.in_context[0]
        else:
            children = parent.corpus[source]
            left = [(t, c) for t, c in zip(children.tokens, children.counts) if t not in parent.children]
            if self.sampled and len(left) > 1:
                tokens = np.array([t for t, _ in left], dtype=np.int64)
                probs = np.array([c for _, c in left], dtype=np.float64)
                probs /= probs.sum()
                u = float(torch.rand((), generator=self.generator))
                token = int(tokens[min(int(np.searchsorted(np.cumsum(probs), u, "right")), tokens.size - 1)])
                q = (tokens, probs)
            else:
                token = left[0][0]
        node = _Node(token=token, parent=i, depth=parent.depth + 1, survival=score, q=q, feature=feature)
        if parent.in_context and parent.in_context[0] == token:
            node.in_context = parent.in_context[1:]
        for children in parent.corpus:  # the first (longest) level that saw this token drafts on after it
            if token in children.tokens:
                node.corpus = self._corpus_children(children.key, self.index.advance(children.positions, token))
                break
        parent.children[token] = len(self.nodes)
        parent.last_child_score = score
        self.nodes.append(node)

    # -- output -------------------------------------------------------------------------------------------------
    def tokens(self) -> list[int]:
        return [n.token for n in self.nodes]

    def parents(self) -> list[int]:
        return [n.parent for n in self.nodes]

    def survival(self) -> list[float]:
        return [n.survival for n in self.nodes]
