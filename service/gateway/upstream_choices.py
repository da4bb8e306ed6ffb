"""What one choice of an OpenAI-HTTP upstream's answer carries, read back into a `Chunk`: its text and its logprobs as
the `TokenScore`s DeepSpec's worker sends, so the gateway renders both kinds of worker alike (`logprobs.py` writes
OpenAI's shapes; this module reads them).

- Chat, `choices[i].logprobs.content[*]`: `{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}`.
- Completions, the legacy shape: `{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}`; a token
  without a logprob (an echoed prompt's first) has None in both lists.

What the shapes do not say stays unknown: token ids (`UNKNOWN_TOKEN_ID`; the gRPC API leaves them unset). Each
position keeps the `top_logprobs` / `logprobs` likeliest alternatives asked for: an engine may add the sampled token
to them (vLLM's and OpenAI's "up to logprobs+1 elements", llama.cpp's chat alternatives), which the gateway adds
back where OpenAI's shape has it. An answer without the logprobs asked for (an engine that ignores the field) is
refused rather than passed on without them.

Echo (completions prompt scoring, `GenerationRequest.prompt_logprobs`): the engine answers the prompt's tokens
before the completion's, in one list, and the prompt before the completion's text, in each choice's first chunk
(vllm/entrypoints/openai/serving_completion.py `completion_stream_generator`, `request_output_to_completion_response`).
`ChoiceReader` splits them again: a token-id prompt is its ids' count of tokens; a text prompt is the tokens whose
texts add up to it (an engine whose prompt tokens do not decode to the prompt's characters splits off by those).
"""

from __future__ import annotations

from deepspec_protocol.token_scores import TokenScore
from service.gateway.worker_client import Chunk, GenerationRequest, WorkerError

#: the token id of a score whose upstream sent only the token's text
UNKNOWN_TOKEN_ID = -1


def choice_text(choice: dict) -> str:
    """A choice's text: `text` (completions), `delta.content` (chat chunks) or `message.content` (whole chat)."""
    if "text" in choice:
        return choice.get("text") or ""
    part = choice.get("delta") or choice.get("message") or {}
    return part.get("content") or ""


def choice_index(choice: dict) -> int:
    index = choice.get("index") or 0
    if not isinstance(index, int) or index < 0:
        raise WorkerError("INTERNAL", f"the upstream sent a choice index that is not a count: {index!r}")
    return index


def _likeliest(alternatives: list[tuple[str, float]], num_top: int) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """The `num_top` likeliest (text, logprob) pairs, likeliest first, as TokenScore's top columns."""
    kept = sorted(alternatives, key=lambda pair: -pair[1])[:num_top]
    return tuple(text for text, _ in kept), tuple(float(logprob) for _, logprob in kept)


def _score(token: str, logprob: float | None, alternatives: list[tuple[str, float]], num_top: int) -> TokenScore:
    if logprob is None:  # nothing predicts it: no logprob, no alternatives
        return TokenScore(token, UNKNOWN_TOKEN_ID, None)
    texts, logprobs = _likeliest(alternatives, num_top)
    return TokenScore(token, UNKNOWN_TOKEN_ID, float(logprob), texts, (UNKNOWN_TOKEN_ID,) * len(texts), logprobs)


def chat_scores(logprobs: dict, num_top: int) -> list[TokenScore]:
    """Chat's `logprobs` object as scores, `num_top` alternatives each at most."""
    return [
        _score(
            item["token"],
            item["logprob"],
            [(top["token"], top["logprob"]) for top in item.get("top_logprobs") or ()],
            num_top,
        )
        for item in logprobs.get("content") or ()
    ]


def completion_scores(logprobs: dict, num_top: int) -> list[TokenScore]:
    """The legacy `logprobs` object as scores, `num_top` alternatives each at most."""
    tokens, token_logprobs = logprobs.get("tokens") or [], logprobs.get("token_logprobs") or []
    top_logprobs = logprobs.get("top_logprobs") or [None] * len(tokens)
    if not len(tokens) == len(token_logprobs) == len(top_logprobs):
        raise ValueError("tokens, token_logprobs and top_logprobs differ in length")
    return [
        _score(token, logprob, list((top or {}).items()), num_top)
        for token, logprob, top in zip(tokens, token_logprobs, top_logprobs)
    ]


class ChoiceReader:
    """Reads the choices of one request's answer, whole or streamed, into Chunks (`Chunk.index` the choice's): the
    text, the generated tokens' scores where the request asked for them, and the echoed prompt's, split off the
    first time each choice is read."""

    def __init__(self, req: GenerationRequest):
        self.chat = req.messages is not None
        self.num_top, self.num_prompt_top = req.logprobs, req.prompt_logprobs
        self.prompt, self.prompt_token_ids = req.prompt or "", req.prompt_token_ids
        #: the choices whose echoed prompt has been split off
        self._echoed: set[int] = set()

    def chunk(self, choice: dict) -> Chunk:
        index, text = choice_index(choice), choice_text(choice)
        scores = self._scores(choice, text)
        prompt_scores = None
        if self.num_prompt_top is not None and index not in self._echoed:
            self._echoed.add(index)
            split = self._num_prompt_tokens(scores)
            prompt_scores, scores = [_trim(s, self.num_prompt_top) for s in scores[:split]], scores[split:]
            echoed = "".join(s.token for s in prompt_scores) if self.prompt_token_ids is not None else self.prompt
            text = text[len(echoed) :] if text.startswith(echoed) else text
        generated = None if self.num_top is None else [_trim(s, self.num_top) for s in scores]
        return Chunk(text, logprobs=generated, prompt_logprobs=prompt_scores, index=index)

    def _scores(self, choice: dict, text: str) -> list[TokenScore]:
        """All the tokens the choice scores, with as many alternatives as the body asked for."""
        if self.num_top is None and self.num_prompt_top is None:
            return []
        logprobs = choice.get("logprobs")
        if logprobs is None:
            if text:
                raise WorkerError(
                    "INVALID_ARGUMENT", "logprobs are not supported by this worker: it answered without them"
                )
            return []
        num_top = max(n for n in (self.num_top, self.num_prompt_top) if n is not None)
        try:
            return chat_scores(logprobs, num_top) if self.chat else completion_scores(logprobs, num_top)
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise WorkerError(
                "INTERNAL", f"the upstream sent logprobs that are not OpenAI's shape: {type(e).__name__}: {e}"
            ) from None

    def _num_prompt_tokens(self, scores: list[TokenScore]) -> int:
        """How many of a choice's first scores are the echoed prompt's."""
        if self.prompt_token_ids is not None:
            return len(self.prompt_token_ids)
        num_chars = num_tokens = 0
        while num_tokens < len(scores) and num_chars < len(self.prompt):
            num_chars += len(scores[num_tokens].token)
            num_tokens += 1
        return num_tokens


def _trim(score: TokenScore, num_top: int) -> TokenScore:
    """`score` with its `num_top` likeliest alternatives (the body asked for the most either table wanted)."""
    if len(score.top_tokens) <= num_top:
        return score
    return TokenScore(
        score.token,
        score.token_id,
        score.logprob,
        score.top_tokens[:num_top],
        score.top_token_ids[:num_top],
        score.top_logprobs[:num_top],
    )
