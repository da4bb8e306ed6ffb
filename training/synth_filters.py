"""What makes a synthesized user turn usable: the filters, the near-duplicate index and the topic buckets of `synth`.

A target continuing its own user prefix (synth.py) writes mostly plausible requests, and also: turns cut off at the
token limit, role headers and template tokens it learned from its chat data, runs of one phrase, text in another
script, and the same few favourite questions again and again. Each is caught here by one cheap, explainable test, so
the rejection counts of a run say what the target does wrong.
"""

from __future__ import annotations

import re
from collections import Counter

from training.heldout import normalize, text_key

#: a line that is only a chat role (the model wrote the next turn's header as text)
_ROLE_LINE = re.compile(r"^\s*(user|assistant|system|human|gpt)\s*:?\s*$", re.IGNORECASE | re.MULTILINE)
#: chat-template markup written as text: <|im_start|>, <|eot_id|>, <s>, [INST] ...
_MARKUP = re.compile(r"<\|[^|>]{1,30}\|>|</?s>|\[/?INST\]|<start_of_turn>|<end_of_turn>")
_WORD = re.compile(r"[A-Za-z']+|\d+")
#: common English function words: a request in English has at least one of them
_STOPWORDS = frozenset(
    ["a", "an", "the", "to", "of", "in", "on", "for", "and", "or", "is", "are", "be", "can", "you", "your", "me"]
    + ["my", "i", "it", "this", "that", "with", "what", "how", "why", "when", "where", "which", "who", "do", "does"]
    + ["please", "write", "give", "make", "help", "explain", "about", "from", "as", "at", "by", "if"]
)


def reject_reason(
    text: str,
    token_ids: list[int],
    finish_reason: str | None,
    special_ids: frozenset[int],
    *,
    min_words: int = 3,
    max_chars: int = 2000,
) -> str | None:
    """Why this user turn is unusable, or None. `finish_reason` "stop" means the target ended the turn itself;
    anything else (the token limit) is a turn cut off mid-thought."""
    if finish_reason != "stop":
        return "unfinished"
    stripped = text.strip()
    if not stripped:
        return "empty"
    if any(t in special_ids for t in token_ids) or _MARKUP.search(text) or _ROLE_LINE.search(text):
        return "template_leak"
    visible = [c for c in stripped if not c.isspace()]
    if sum(1 for c in visible if not c.isascii()) > 0.1 * len(visible):
        return "not_english"
    words = _WORD.findall(stripped)
    if len(words) < min_words:
        return "too_short"
    if len(stripped) > max_chars:
        return "too_long"
    if len(words) >= 4 and not any(w.lower() in _STOPWORDS for w in words):
        return "not_english"
    if sum(1 for c in visible if c.isalpha()) < 0.5 * len(visible):
        return "garbage"
    if _repetitive(words):
        return "repetitive"
    return None


def _repetitive(words: list[str], n: int = 3, min_unique: float = 0.5) -> bool:
    """True when under half of the word n-grams are distinct (a phrase looping), for turns long enough to tell."""
    if len(words) < 4 * n:
        return False
    grams = [tuple(w.lower() for w in words[i : i + n]) for i in range(len(words) - n + 1)]
    return len(set(grams)) < min_unique * len(grams)


def shingles(text: str, n: int = 3) -> set[str]:
    """Word n-grams of the normalized text (the whole text for a turn shorter than n words)."""
    words = _WORD.findall(normalize(text))
    if len(words) < n:
        return {" ".join(words)}
    return {" ".join(words[i : i + n]) for i in range(len(words) - n + 1)}


class Deduplicator:
    """Exact duplicates (normalized text) and near duplicates (MinHash LSH over word 3-gram shingles: Jaccard
    similarity estimated above `threshold`), via datasketch, the library most dedup pipelines use."""

    def __init__(self, threshold: float = 0.7, num_perm: int = 64):
        from datasketch import MinHashLSH

        self.threshold, self.num_perm = threshold, num_perm
        self._exact: set[str] = set()
        self._lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)

    def __len__(self) -> int:
        return len(self._exact)

    def _minhash(self, text: str):
        from datasketch import MinHash

        m = MinHash(num_perm=self.num_perm, seed=1)
        m.update_batch([s.encode("utf-8") for s in shingles(text)])
        return m

    def check_and_add(self, text: str) -> str | None:
        """ "exact" or "near_duplicate" when the text (or one like it) was seen; else None, and it is remembered."""
        key = text_key(text)
        if key in self._exact:
            return "exact_duplicate"
        minhash = self._minhash(text)
        if self._lsh.query(minhash):
            return "near_duplicate"
        self._exact.add(key)
        self._lsh.insert(key, minhash)
        return None


#: topic -> keyword pattern, tested in this order (a JSON coding request is "json"); cheap and explainable buckets
TOPIC_PATTERNS: dict[str, re.Pattern] = {
    "json/data": re.compile(r"\b(json|yaml|csv|xml|table|spreadsheet|dataset|schema)\b", re.IGNORECASE),
    "coding": re.compile(
        r"```|\b(python|javascript|typescript|java|c\+\+|c#|rust|golang|sql|html|css|code|coding|"
        r"function|script|program|programming|algorithm|api|debug|bug|compile|regex|class|array|"
        r"string|loop|variable|database|linux|bash|shell)\b",
        re.IGNORECASE,
    ),
    "math": re.compile(
        r"\b(calculate|equation|solve|integral|derivative|probability|percent|percentage|math|"
        r"mathematics|algebra|geometry|fraction|average|sum|area|volume|factorial|prime)\b|"
        r"\d+\s*[-+*/×^]\s*\d+",
        re.IGNORECASE,
    ),
    "writing": re.compile(
        r"\b(write|rewrite|poem|story|essay|email|letter|paraphrase|summarize|summary|edit|"
        r"grammar|blog|article|slogan|sentence|paragraph|outline|script|speech|lyrics)\b",
        re.IGNORECASE,
    ),
    "advice/planning": re.compile(
        r"\b(tips|advice|plan|planning|recommend|suggest|ideas|strategy|improve|"
        r"should i|help me)\b",
        re.IGNORECASE,
    ),
    "question": re.compile(
        r"^\s*(what|who|why|how|when|where|which|is|are|can|does|do|did|could|would)\b|\?\s*$", re.IGNORECASE
    ),
}
OTHER_TOPIC = "other"


def topic_of(text: str) -> str:
    for topic, pattern in TOPIC_PATTERNS.items():
        if pattern.search(text):
            return topic
    return OTHER_TOPIC


def distinct_n(texts: list[str], n: int = 2) -> float:
    """Distinct word n-grams over all n-grams of the texts (distinct-2: the usual lexical diversity measure)."""
    grams: Counter = Counter()
    for text in texts:
        words = _WORD.findall(normalize(text))
        grams.update(tuple(words[i : i + n]) for i in range(len(words) - n + 1))
    total = sum(grams.values())
    return len(grams) / total if total else 0.0
