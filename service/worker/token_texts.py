"""The text of each scored token, and which response carries it: the engine's logprobs (`TokenLogprob`: ids and
numbers) become `TokenScore`s (deepspec_protocol/token_scores.py) the gateway can render without a tokenizer.

A token's text is what it adds to the output, decoded in context with the engine's own incremental detokenizer
(deepspec/decoding/detokenizer.py), so the texts of a request's tokens concatenate to its text. A token that ends
inside a multi-byte UTF-8 character adds no text of its own (""): the character is the text of the token that
completes it (bytes that never form a character decode to U+FFFD, in the text and in that token's). So OpenAI's
`bytes` (the UTF-8 of `token`) concatenate to the UTF-8 of the text too. Alternatives are decoded on their own
(`decode([id])`, as vLLM does), which for a partial token is U+FFFD; a special token, which decoding skips, reads as
its name in the tokenizer (`<|im_end|>`), so no alternative is "".

Alignment: the engine streams a step's text only once it is safe (an incomplete character, or the start of a
possible stop string, is held back), so a response carries the scores of the tokens whose text its text completes
and the held ones come with a later response. A stop string is cut from the text but its tokens were generated: their
scores come with the last response (every generated token has one, as in vLLM), the one case where a response's
tokens concatenate to more than its text. A stop token (EOS, a stop id) that ended the request is not emitted and
has no text, but it has a score, last, with token "": a scorer that asks for one token after the prompt always gets
one entry past the prompt (lm-eval's log-likelihood requests send echo + max_tokens 1 and drop the last entry).
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable

from deepspec.decoding.detokenizer import IncrementalDetokenizer
from deepspec.decoding.logprobs import TokenLogprob
from deepspec.decoding.params import StepOutput
from deepspec_protocol.token_scores import TokenScore


def alternative_texts(target) -> Callable[[int], str]:
    """token id -> its text on its own, cached (a vocabulary is finite); a token that decodes to nothing (a special
    token) reads as the tokenizer's name for it, where the target's tokenizer has names."""
    names = getattr(target.tokenizer, "convert_ids_to_tokens", None)

    @functools.lru_cache(maxsize=1 << 16)
    def text(token: int) -> str:
        decoded = target.decode([token])
        return decoded if decoded or names is None else str(names(token))

    return text


def prompt_scores(
    prompt_ids: list[int],
    logprobs: list[TokenLogprob | None],
    decode: Callable[[list[int]], str],
    token_text: Callable[[int], str],
) -> list[TokenScore]:
    """The prompt's tokens with their texts and the engine's scores; the first has no logprob. The texts concatenate
    to the decoded prompt: bytes a prompt ends with that complete no character are the last token's text (U+FFFD),
    so an echoed token-id prompt reads as `decode` reads it."""
    pieces = IncrementalDetokenizer(decode)
    texts = [pieces.add([token])[0] for token in prompt_ids]
    whole, joined = decode(prompt_ids), "".join(texts)
    if texts and whole.startswith(joined):
        texts[-1] += whole[len(joined) :]
    return [_score(text, token, lp, token_text) for text, token, lp in zip(texts, prompt_ids, logprobs)]


class OutputScores:
    """One request's generated tokens: `step(out)` -> the scores of the tokens whose text `out.new_text` completes."""

    def __init__(self, decode: Callable[[list[int]], str], token_text: Callable[[int], str]):
        self._pieces = IncrementalDetokenizer(decode)  # no stop strings: every token's whole text
        self._token_text = token_text
        #: (characters of output text up to the end of this token's, its score), oldest first
        self._pending: deque[tuple[int, TokenScore]] = deque()
        self._pieces_chars = 0
        self._text_chars = 0

    def step(self, out: StepOutput) -> list[TokenScore]:
        for token, lp in zip(out.new_token_ids, out.logprobs or ()):
            piece = self._pieces.add([token])[0]
            self._pieces_chars += len(piece)
            self._pending.append((self._pieces_chars, _score(piece, token, lp, self._token_text)))
        if out.stop_logprob is not None:  # not emitted, so no text: scored last (see the module docstring)
            lp = out.stop_logprob
            self._pending.append((self._pieces_chars, _score("", lp.token_id, lp, self._token_text)))
        self._text_chars += len(out.new_text)
        released = []
        while self._pending and (out.finished or self._pending[0][0] <= self._text_chars):
            released.append(self._pending.popleft()[1])
        return released


def _score(piece: str, token: int, lp: TokenLogprob | None, token_text: Callable[[int], str]) -> TokenScore:
    if lp is None:
        return TokenScore(piece, token, None)
    return TokenScore(
        piece, token, lp.logprob, tuple(token_text(t) for t in lp.top_token_ids), lp.top_token_ids, lp.top_logprobs
    )
