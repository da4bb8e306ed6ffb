"""Incremental detokenization and stop strings, with work bounded per step (not by the output length).

Tokens are decoded in a short sliding window (after vLLM's prefix/read offsets): the text of the window minus
the text of its already-emitted part is the new text. A trailing U+FFFD means a multi-byte character is still
incomplete, so it is held back until the next token completes it.

With stop strings, a tail that could still grow into one is held back too, in whole pieces (the text each decoded
step added): a streamed chunk's text is then always made of whole token texts, so the logprobs a chunk carries
(service/worker/token_texts.py) concatenate to exactly its text.

It needs only the target's `decode(ids) -> str` (special tokens skipped), which must depend on `ids` alone.
"""

from __future__ import annotations

from collections.abc import Callable


class IncrementalDetokenizer:
    def __init__(self, decode: Callable[[list[int]], str], stop: tuple[str, ...] = ()):
        self._decode = decode
        self.stop = stop
        self._max_stop_len = max((len(s) for s in stop), default=0)
        self.token_ids: list[int] = []
        self.text = ""  # emitted text so far
        self._prefix_offset = 0
        self._read_offset = 0
        #: the last pieces, withheld because their tail may be the start of a stop string
        self._held: list[str] = []

    def add(self, new_ids: list[int]) -> tuple[str, int | None]:
        """Append tokens → (text safe to emit now, index in new_ids after which a stop string completed)."""
        emitted = []
        for i, token in enumerate(new_ids):
            self.token_ids.append(token)
            prefix = self._decode(self.token_ids[self._prefix_offset : self._read_offset])
            full = self._decode(self.token_ids[self._prefix_offset :])
            if full.endswith("\ufffd") or len(full) <= len(prefix):
                continue
            piece = full[len(prefix) :]
            self._prefix_offset, self._read_offset = self._read_offset, len(self.token_ids)
            if not self.stop:
                emitted.append(piece)
                continue
            pieces = [*self._held, piece]
            pending = "".join(pieces)
            cut = _find_stop(pending, self.stop)
            if cut is not None:
                emitted.append(pending[:cut])
                self._held = []
                out = "".join(emitted)
                self.text += out
                return out, i
            # keep back the longest tail that could still grow into a stop string, and the whole pieces it is in
            keep = min(len(pending), self._max_stop_len - 1)
            while keep and not any(s.startswith(pending[len(pending) - keep :]) for s in self.stop):
                keep -= 1
            held_chars, self._held = 0, []
            while held_chars < keep:
                self._held.insert(0, pieces.pop())
                held_chars += len(self._held[0])
            emitted.extend(pieces)
        out = "".join(emitted)
        self.text += out
        return out, None

    def flush(self) -> str:
        """At the end of generation, release whatever was withheld."""
        out, self._held = "".join(self._held), []
        self.text += out
        return out


def _find_stop(text: str, stops: tuple[str, ...]) -> int | None:
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None
