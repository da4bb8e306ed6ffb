"""A suffix array over target-written text: where did the current context's longest suffix occur before, and what
did the target most often write next?

The corpus is the target's own answers (`python -m training prepare`), one token array with a SEPARATOR after each
answer. Matching works on the *reversed* corpus: the context read backwards from its last token is a prefix of
reversed suffixes, so one left-to-right narrowing of a sorted range finds the longest match in one pass, however
long it is (REST, arXiv 2311.08252, matches forwards and retries shorter suffixes instead). From the matched
occurrences the continuation is a greedy walk: the most frequent next token, keep the occurrences that agree,
repeat (the greedy path of SuffixDecoding's tree, arXiv 2411.04975).

Memory is three int32 arrays of the corpus length (1.5M tokens ≈ 18 MB). Lookups are numpy gathers over the
matched range only; the first token uses a presorted column, so a lookup never touches the whole corpus.
"""

from __future__ import annotations

import numpy as np

#: ends every answer in the corpus; never a token id, so no match or continuation crosses it
SEPARATOR = -1
#: pads the reversed corpus past its end so every suffix has `max_match` readable tokens
_PAD = -2
#: occurrences a continuation is voted on at most (drafting must stay well under a millisecond)
MAX_OCCURRENCES = 2048
#: matched ranges up to this many suffixes are searched by gathering their next column; wider ones by bisection
_GATHER_LIMIT = 256


def _reversed_padded(tokens: np.ndarray, max_match: int) -> np.ndarray:
    return np.concatenate([tokens[::-1], np.full(max_match, _PAD, dtype=np.int32)])


def build_suffix_array(tokens: np.ndarray, max_match: int) -> np.ndarray:
    """Order of the reversed corpus's suffixes by their first `max_match` tokens ([N] int32).

    Ties beyond `max_match` keep corpus order (lexsort is stable), so building is deterministic. Ids shifted past
    _PAD and SEPARATOR fit uint16 for vocabularies under 65,534 tokens, and numpy sorts 16-bit keys by radix:
    ~3x faster than int32 keys (1M tokens: ~1.5 s against ~5 s on a loaded core), the same order."""
    reversed_tokens = _reversed_padded(tokens, max_match)
    shifted = reversed_tokens.astype(np.int64) - _PAD
    if len(tokens) and shifted.min() >= 0 and shifted.max() <= np.iinfo(np.uint16).max:
        reversed_tokens = shifted.astype(np.uint16)
    n = len(tokens)
    keys = [reversed_tokens[d : d + n] for d in range(max_match - 1, -1, -1)]  # lexsort: last key is primary
    return np.lexsort(keys).astype(np.int32)


class SuffixIndex:
    def __init__(self, tokens: np.ndarray, suffix_array: np.ndarray, max_match: int):
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        if tokens.ndim != 1 or suffix_array.shape != tokens.shape:
            raise ValueError(
                f"suffix array of shape {tuple(suffix_array.shape)} does not index {tokens.shape[0]} tokens"
            )
        if max_match < 1:
            raise ValueError(f"max_match must be >= 1, got {max_match}")
        self.tokens = tokens
        self.max_match = max_match
        self._sa = np.ascontiguousarray(suffix_array, dtype=np.int64)
        n = len(tokens)
        if n and (self._sa.min() < 0 or self._sa.max() >= n or np.bincount(self._sa, minlength=n).max() != 1):
            raise ValueError(f"suffix array is not a permutation of the {n} corpus positions")
        self._reversed = _reversed_padded(tokens, max_match)
        self._first = self._reversed[self._sa]  # the sorted first column: the first narrowing is a binary search
        # memoryviews read single entries as Python ints ~5x faster than numpy scalar indexing (see _narrow)
        # ndarray is a buffer; numpy's stubs declare __buffer__ only for Python >= 3.12
        self._sa_view = memoryview(self._sa)  # pyright: ignore[reportArgumentType]
        self._reversed_view = memoryview(self._reversed)  # pyright: ignore[reportArgumentType]
        if len(self._first) > 1 and np.any(self._first[1:] < self._first[:-1]):
            raise ValueError("suffix array is not sorted for this corpus (corrupt or built from other tokens)")

    @classmethod
    def build(cls, tokens: np.ndarray, max_match: int = 12) -> SuffixIndex:
        tokens = np.asarray(tokens, dtype=np.int32)
        return cls(tokens, build_suffix_array(tokens, max_match), max_match)

    @property
    def suffix_array(self) -> np.ndarray:
        """[N] int32, what build_suffix_array returned (for saving beside the tokens)."""
        return self._sa.astype(np.int32)

    def __len__(self) -> int:
        return len(self.tokens)

    def longest_match(self, context: list[int]) -> tuple[int, np.ndarray]:
        """(m, positions): the longest m <= max_match such that context[-m:] occurs in the corpus, and the corpus
        index right after each occurrence ([count] int64; empty with m = 0)."""
        levels = self.matches(context)
        return levels[0] if levels else (0, np.empty(0, dtype=np.int64))

    def matches(self, context: list[int], min_match: int = 1) -> list[tuple[int, np.ndarray]]:
        """Every match length m >= min_match of the context's suffix, longest first, as (m, positions) like
        `longest_match`; a shorter m is listed only where it has more occurrences than the longer one (it then
        adds continuations the longer match never saw). The narrowing computes them all in one pass."""
        lo, hi = 0, len(self._sa)
        ranges: list[tuple[int, int, int]] = []
        for depth, token in enumerate(reversed(context[-self.max_match :])):
            # suffixes in [lo, hi) share their first `depth` tokens, so their next column is sorted too
            new_lo, new_hi = self._narrow(lo, hi, depth, token)
            if new_lo >= new_hi:
                break
            lo, hi = new_lo, new_hi
            ranges.append((depth + 1, lo, hi))
        out, count = [], 0
        for matched, lo, hi in reversed(ranges):
            if matched < min_match or hi - lo == count:
                continue
            count = hi - lo
            # reversed index i holds original index n-1-i (the context's last token); what follows it is at n-i
            out.append((matched, len(self.tokens) - self._sa[lo:hi]))
        return out

    def _narrow(self, lo: int, hi: int, depth: int, token: int) -> tuple[int, int]:
        """The sub-range of suffixes [lo, hi) (which share their first `depth` tokens) whose next one is `token`.

        A narrow range gathers its column and searches it in numpy; a wide one (a frequent last token matches
        ~10^4-10^5 suffixes) bisects, reading only the ~2·log2(range) entries it visits instead of gathering them
        all. On the shipped corpus (10^6 tokens) the two changes here, this and the int32 search key, took a match
        from 1.6 ms to 0.2 ms."""
        if depth == 0 or hi - lo <= _GATHER_LIMIT:
            column = self._first[lo:hi] if depth == 0 else self._reversed[self._sa[lo:hi] + depth]
            key = np.int32(token)  # a Python int key makes numpy cast the whole column first (~0.4 ms for 10^6)
            return lo + int(np.searchsorted(column, key, "left")), lo + int(np.searchsorted(column, key, "right"))
        sa, rev = self._sa_view, self._reversed_view

        def bound(first: int, last: int, right: bool) -> int:  # first index in [first, last) past the token's start/end
            while first < last:
                mid = (first + last) // 2
                value = rev[sa[mid] + depth]
                if value < token or (right and value == token):
                    first = mid + 1
                else:
                    last = mid
            return first

        start = bound(lo, hi, False)
        return start, bound(start, hi, True)

    def next_tokens(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """What follows the occurrences `positions`: (tokens, counts) most frequent first (ties: smaller id first)
        and the number of occurrences voted (answers that end there count, as continuations no draft can match)."""
        if positions.size > MAX_OCCURRENCES:  # a one-token match of "\n" has ~10^4: an even sample votes as well
            positions = positions[:: -(-positions.size // MAX_OCCURRENCES)]
        total = int(positions.size)
        positions = positions[positions < len(self.tokens)]
        following = self.tokens[positions]
        following = following[following != SEPARATOR]
        if following.size == 0:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), total
        tokens, counts = np.unique(following, return_counts=True)
        order = np.lexsort((tokens, -counts))
        return tokens[order].astype(np.int64), counts[order].astype(np.int64), total

    def advance(self, positions: np.ndarray, token: int) -> np.ndarray:
        """The occurrences among `positions` that continue with `token`, moved past it."""
        positions = positions[positions < len(self.tokens)]
        return positions[self.tokens[positions] == token] + 1

    def continuation(self, positions: np.ndarray, k: int) -> tuple[list[int], list[float]]:
        """Greedy walk from the occurrences `positions`: up to k tokens, each the most frequent next token among
        the occurrences that agreed so far, with the fraction of them that agreed (a frequency estimate of its
        conditional acceptance)."""
        tokens, agreement = [], []
        if positions.size > MAX_OCCURRENCES:  # a one-token match of "\n" has ~10^4: an even sample votes as well
            positions = positions[:: -(-positions.size // MAX_OCCURRENCES)]
        for _ in range(k):
            positions = positions[positions < len(self.tokens)]
            if positions.size == 0:
                break
            if positions.size == 1:  # one occurrence left: the rest of the walk is the text that follows it
                start = int(positions[0])
                for token in self.tokens[start : start + k - len(tokens)].tolist():
                    if token == SEPARATOR:
                        break
                    tokens.append(token)
                    agreement.append(1.0)
                break
            following = self.tokens[positions]
            token, count = _most_frequent(following)
            if token is None:
                break
            tokens.append(token)
            agreement.append(count / following.size)
            positions = positions[following == token] + 1
        return tokens, agreement


#: occurrences up to this many are voted on in Python (a bincount zero-fills one counter per vocabulary id:
#: ~0.01 ms a draft token at 49,152 ids, most of a corpus draft's time)
_VOTE_IN_PYTHON = 64


def _most_frequent(following: np.ndarray) -> tuple[int | None, int]:
    """The most frequent token among `following` other than SEPARATOR, ties to the smallest id (so drafts are
    deterministic), and its count; (None, 0) when there is none."""
    if following.size <= _VOTE_IN_PYTHON:
        counts: dict[int, int] = {}
        for token in following.tolist():
            if token != SEPARATOR:
                counts[token] = counts.get(token, 0) + 1
        if not counts:
            return None, 0
        best = max(counts.values())
        return min(t for t, c in counts.items() if c == best), best
    histogram = np.bincount(following[following != SEPARATOR])
    if histogram.size == 0:
        return None, 0
    token = int(histogram.argmax())
    return token, int(histogram[token])
