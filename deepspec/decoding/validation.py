"""Request validation, once, where the knowledge lives: the engine knows its context window and vocabulary.

Every refusal is a `RequestError` (a ValueError) carrying a `RequestErrorCode`, so servers map the code to a status
(HTTP 400 / gRPC INVALID_ARGUMENT) and forward it to clients without reading the message. The code values are the
OpenAI-style `error.code` strings the gateway returns; deepspec_protocol/worker.py says how they travel from worker to
gateway. Sampling parameters are checked where they are built (`SamplingParams.__post_init__`), the prompt against
the window here (`SpecEngine.validate`, also called by `add_request`).
"""

from __future__ import annotations

from enum import Enum


class RequestErrorCode(str, Enum):
    #: the prompt has no tokens
    PROMPT_EMPTY = "prompt_empty"
    #: a prompt token id is not an integer in [0, vocab_size)
    PROMPT_TOKEN_INVALID = "prompt_token_invalid"
    #: the prompt, or the prompt plus max_tokens, does not fit the context window (OpenAI's code for both)
    CONTEXT_TOO_LONG = "context_length_exceeded"
    #: max_tokens is not an integer >= 1
    MAX_TOKENS_INVALID = "max_tokens_invalid"
    #: temperature, top_k, top_p, seed or stop out of range
    SAMPLING_INVALID = "sampling_invalid"
    #: a request with this id is already running
    REQUEST_ID_IN_USE = "request_id_in_use"
    #: a structured-output constraint (JSON schema, regex, grammar, choice) that does not compile, or an unknown kind
    STRUCTURED_OUTPUT_INVALID = "structured_output_invalid"


class RequestError(ValueError):
    """Bad input the caller can fix; `code` says which rule it broke, the message says how to fix it."""

    def __init__(self, code: RequestErrorCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def validate_request(prompt_token_ids: list[int], max_tokens: int, *, max_seq_len: int, vocab_size: int) -> None:
    """Raise RequestError unless the prompt and max_tokens new tokens fit a context window of `max_seq_len` tokens
    (takes the one number it checks, not SamplingParams: params.py imports this module)."""
    n = len(prompt_token_ids)
    if n == 0:
        raise RequestError(RequestErrorCode.PROMPT_EMPTY, "the prompt is empty: send at least one token")
    if any(not isinstance(t, int) or t < 0 or t >= vocab_size for t in prompt_token_ids):
        raise RequestError(
            RequestErrorCode.PROMPT_TOKEN_INVALID, f"prompt token ids must be integers in [0, {vocab_size})"
        )
    if n >= max_seq_len:
        raise RequestError(
            RequestErrorCode.CONTEXT_TOO_LONG,
            f"this model's maximum context length is {max_seq_len} tokens and the prompt has {n} "
            "tokens: shorten the prompt",
        )
    if n + max_tokens > max_seq_len:
        raise RequestError(
            RequestErrorCode.CONTEXT_TOO_LONG,
            f"this model's maximum context length is {max_seq_len} tokens; the prompt has {n} tokens "
            f"and max_tokens is {max_tokens}: lower max_tokens to at most {max_seq_len - n} "
            "or shorten the prompt",
        )
