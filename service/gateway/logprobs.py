"""OpenAI's two logprobs shapes, rendered from the `TokenScore`s a worker sends (deepspec_protocol/token_scores.py).

- Chat, `choices[i].logprobs`: `{"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}],
  "refusal": null}`, top_logprobs the N likeliest (OpenAI's chat object).
- Completions, the legacy shape: `{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}`. Each
  top_logprobs dict holds the N likeliest and the chosen token (OpenAI: "the API will always return the logprob of
  the sampled token, so there may be up to logprobs+1 elements"); a token without a logprob (the prompt's first,
  with echo) has None in both lists, as vLLM and OpenAI answer. text_offset is each token's character offset in the
  choice's text.

The numbers are the worker's: by default the target's raw distribution (before temperature, top-k, top-p), or the
one each token was sampled from with `logprobs_mode: processed_logprobs`, where a token outside the top-k or top-p
has -inf. JSON has no -Infinity: a logprob below LOGPROB_FLOOR is written as the floor, as vLLM does.
"""

from __future__ import annotations

from deepspec_protocol.token_scores import TokenScore

LOGPROB_FLOOR = -9999.0


def _finite(logprob: float) -> float:
    return max(logprob, LOGPROB_FLOOR)


def _generated(logprob: float | None) -> float:
    """A generated token's logprob, made finite: only the prompt's first token has none, and chat echoes no prompt."""
    if logprob is None:
        raise ValueError("a generated token came without its logprob")
    return _finite(logprob)


def _utf8(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def chat_logprobs(scores: list[TokenScore]) -> dict:
    return {
        "content": [
            {
                "token": s.token,
                "logprob": _generated(s.logprob),
                "bytes": _utf8(s.token),
                "top_logprobs": [
                    {"token": t, "logprob": _finite(lp), "bytes": _utf8(t)}
                    for t, lp in zip(s.top_tokens, s.top_logprobs)
                ],
            }
            for s in scores
        ],
        "refusal": None,
    }


def completion_logprobs(scores: list[TokenScore], start: int = 0) -> dict:
    """The legacy shape of `scores`, whose text begins at character `start` of the choice's text (a stream's later
    chunks, the completion after an echoed prompt)."""
    tokens, token_logprobs, top_logprobs, text_offset = [], [], [], []
    for s in scores:
        tokens.append(s.token)
        text_offset.append(start)
        start += len(s.token)
        if s.logprob is None:
            token_logprobs.append(None)
            top_logprobs.append(None)
            continue
        token_logprobs.append(_finite(s.logprob))
        top: dict[str, float] = {}
        for text, logprob in [*zip(s.top_tokens, s.top_logprobs), (s.token, s.logprob)]:
            top.setdefault(text, _finite(logprob))  # two tokens with one text: the likelier one's
        top_logprobs.append(top)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    }


def concat(*shapes: dict) -> dict:
    """Legacy shapes of consecutive parts of one choice (the echoed prompt, then the completion) as one."""
    return {key: [value for shape in shapes for value in shape[key]] for key in shapes[0]}
