"""Session memory: the answers a session was served earlier, drafted from when its next requests repeat them.

Agent loops and multi-turn edits ask the target for text it already wrote in the same session: a file rewritten with
one change, a plan restated, a tool call repeated with other arguments. When the client does not resend that history
(or sends a shortened one), prompt lookup cannot see it; SuffixDecoding (arXiv 2411.04975) keeps it in a suffix
structure per request stream and reaches ~4x on such workloads. Here each session has an n-gram index over its
earlier outputs (like prompt lookup's over the sequence itself, longer n-grams first), searched after the sequence's
own context and before a corpus.

A session is an opaque key the server derives from the API key and the client's session id (`user`, a session
header): sessions never share memory, so one key's text never drafts another's. Opt-in: a request without a session
is neither remembered nor drafted from memory. Bounded: at most `max_sessions` sessions (the least recently used is
evicted whole) of at most `max_tokens_per_session` tokens each (the oldest answers go first); `forget` evicts one.
Drafts from memory are guesses like any other: the target verifies them, so output never depends on what was
remembered, only the speed does.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

#: ends each remembered answer; never a token id, so no match or continuation crosses two answers
SEPARATOR = -1


class _SessionIndex:
    """One session's remembered answers as one token list, and where each n-gram of it last ended."""

    def __init__(self, min_ngram: int, max_ngram: int):
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.tokens: list[int] = []
        self.ngrams: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_ngram, max_ngram + 1)}

    def add(self, answer: list[int]) -> None:
        start = len(self.tokens)
        self.tokens.extend(answer)
        self.tokens.append(SEPARATOR)
        for end in range(start, len(self.tokens) - 1):  # n-grams ending inside the new answer
            for n, table in self.ngrams.items():
                if end + 1 - n >= start:
                    table[tuple(self.tokens[end + 1 - n : end + 1])] = end

    def match(self, context: list[int], k: int) -> tuple[int, list[int]]:
        """(n, up to k tokens that followed the context's last n tokens most recently): the longest n that occurs."""
        for n in range(min(self.max_ngram, len(context)), self.min_ngram - 1, -1):
            end = self.ngrams[n].get(tuple(context[-n:]))
            if end is not None:
                continuation = self.tokens[end + 1 : end + 1 + k]
                return n, continuation[: continuation.index(SEPARATOR)] if SEPARATOR in continuation else continuation
        return 0, []


class SessionMemory:
    """Per-session indexes of served answers, bounded in sessions and tokens (module docstring)."""

    def __init__(
        self, max_sessions: int = 1024, max_tokens_per_session: int = 32768, min_ngram: int = 2, max_ngram: int = 8
    ):
        if max_sessions < 1 or max_tokens_per_session < 1 or not 1 <= min_ngram <= max_ngram:
            raise ValueError("need max_sessions >= 1, max_tokens_per_session >= 1 and 1 <= min_ngram <= max_ngram")
        self.max_sessions, self.max_tokens_per_session = max_sessions, max_tokens_per_session
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self._sessions: OrderedDict[str, tuple[list[list[int]], _SessionIndex]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def num_tokens(self, session: str) -> int:
        """Tokens remembered for `session` (0 for one that is not remembered)."""
        answers = self._sessions.get(session, ([], None))[0]
        return sum(len(a) for a in answers)

    def add(self, session: str, answer: list[int]) -> None:
        """Remember a served answer of `session` (the newest `max_tokens_per_session` tokens of the session stay)."""
        if not answer:
            return
        answers, index = self._sessions.pop(session, ([], None))
        answers = answers + [list(answer)[-self.max_tokens_per_session :]]
        over = sum(len(a) for a in answers) - self.max_tokens_per_session
        if over > 0 or index is None:
            while over > 0:
                over -= len(answers.pop(0))
            index = _SessionIndex(self.min_ngram, self.max_ngram)
            for kept in answers:
                index.add(kept)
        else:
            index.add(answers[-1])
        self._sessions[session] = (answers, index)
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)

    def draft(self, session: str, context, k: int) -> list[int]:
        """Up to k tokens that followed the context's longest recent n-gram in `session`'s answers ([] if none)."""
        return self.match(session, context, k)[1]

    def match(self, session: str, context, k: int) -> tuple[int, list[int]]:
        """`draft` with the length of the n-gram it matched (0 with no match): a caller weighs it against others."""
        entry = self._sessions.get(session)
        if entry is None or k < 1:
            return 0, []
        self._sessions.move_to_end(session)
        tail = context[-entry[1].max_ngram :]
        return entry[1].match(tail.tolist() if isinstance(tail, np.ndarray) else list(tail), k)

    def forget(self, session: str) -> bool:
        """Evict one session's memory; False when it held none."""
        return self._sessions.pop(session, None) is not None
