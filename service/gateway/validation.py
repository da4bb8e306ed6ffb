"""Input limits of the gateway, one set for both APIs: the OpenAI HTTP schemas (`schemas.py`) are built from these
types, and the gRPC API (`grpc_api.py`) validates its requests through those same schemas, so the two refuse the
same things with the same messages.

This is input sanity only (types, ranges, sizes, encodings). Whether a prompt fits the model's context is the
engine's to say (it knows the exact token count), except for one cheap bound checked here before anything is
tokenized: `check_prompt_size`.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError, WithJsonSchema

from deepspec_protocol.worker import LOGPROBS_MODES, MAX_CHARS_PER_TOKEN, MAX_TOP_LOGPROBS, max_prompt_chars
from service.gateway.errors import BadRequestError

#: every request object: strict types (`"max_tokens": "5"` is a 400, as at OpenAI), unknown fields refused
STRICT = ConfigDict(strict=True, extra="forbid")

MAX_INT32 = 2**31 - 1
#: prompts in one completions request (a batch): each becomes a request of its own on a worker, so a batch larger
#: than the workers' slots and queues would only be refused in part
MAX_PROMPTS = 32
#: choices in one request, n per prompt times its prompts: each is a sequence in a worker's batch (the worker
#: refuses more than its batch size: INVALID_ARGUMENT), so this only bounds what one request may fan out to
MAX_CHOICES = 128
#: stop strings per request (OpenAI allows 4; vLLM has no limit)
MAX_STOP_STRINGS = 16
#: characters per stop string: the detokenizer rescans this much text after every token
MAX_STOP_CHARS = 1024
#: characters of a caller-chosen request id (gRPC): it appears in logs and in Abort
MAX_REQUEST_ID_CHARS = 128
#: characters of short identifiers (model, user)
MAX_NAME_CHARS = 256


def _unicode(text):
    """JSON's `\\ud800` escapes decode to lone surrogates, which no tokenizer (or UTF-8 encoder) accepts. Checked
    before pydantic's own string validation, so every text field refuses them with this message."""
    if isinstance(text, str):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"the text is not valid Unicode: a lone surrogate escape at character {e.start}") from None
    return text


Unicode = BeforeValidator(_unicode)


def _json_integer(value):
    """JSON Schema's integer is a number without a fraction: 3 and 3.0, never "3" or true (the models are strict)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


#: an integer as JSON Schema (and so the OpenAPI document) defines it
Integer = BeforeValidator(_json_integer)

#: any text the gateway forwards: a prompt, a message, a stop string
Text = Annotated[str, Unicode]
#: a completion prompt: the worker needs at least one token
Prompt = Annotated[str, Field(min_length=1), Unicode]
#: a batch of text prompts: one choice each
Prompts = Annotated[list[Prompt], Field(min_length=1, max_length=MAX_PROMPTS)]
#: one prompt as token ids (INT32 on the wire); the worker checks them against its vocabulary and context
TokenIds = Annotated[list[Annotated[int, Field(ge=0, le=MAX_INT32), Integer]], Field(min_length=1)]
#: a batch of token-id prompts (what lm-eval's local-completions sends): one choice each
TokenIdBatch = Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]
#: alternatives per position: OpenAI allows 20 for chat's top_logprobs and 5 for completions' logprobs; both take 20
#: here, as vLLM does (its default max_logprobs)
TopLogprobs = Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS), Integer]
#: the distribution logprobs are of, in vLLM's names (its --logprobs-mode, here per request too)
LogprobsMode = Literal["raw_logprobs", "processed_logprobs"]
assert get_args(LogprobsMode) == LOGPROBS_MODES  # the protocol's tuple is the one list of the names
Name = Annotated[str, Field(max_length=MAX_NAME_CHARS), Unicode]
StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS), Unicode]
StopStrings = Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)]
Temperature = Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)]
TopP = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
#: vLLM extension; -1 or 0 = off
TopK = Annotated[int, Field(ge=-1, le=MAX_INT32), Integer]
Seed = Annotated[int, Field(ge=0, lt=2**64), Integer]
MaxTokens = Annotated[int, Field(ge=1, le=MAX_INT32), Integer]
#: choices per prompt (OpenAI's n)
NumChoices = Annotated[int, Field(ge=1, le=MAX_CHOICES), Integer]
#: completions may ask for 0 tokens: only the prompt, scored (echo)
CompletionMaxTokens = Annotated[int, Field(ge=0, le=MAX_INT32), Integer]
#: printable ASCII without spaces: it is written into log lines as is
RequestId = Annotated[str, Field(min_length=1, max_length=MAX_REQUEST_ID_CHARS, pattern=r"^[!-~]+$")]

_REQUEST_ID = TypeAdapter(RequestId)


def neutral_only(*values) -> WithJsonSchema:
    """The JSON schema of an OpenAI field DeepSpec does not implement: only its neutral values are accepted."""
    return WithJsonSchema({"enum": list(values), "description": "not supported: only the neutral value is accepted"})


def check_request_id(request_id: str) -> str:
    try:
        return _REQUEST_ID.validate_python(request_id)
    except ValidationError as e:
        raise BadRequestError(
            f"request_id: {e.errors()[0]['msg']} (printable ASCII, no spaces, at most "
            f"{MAX_REQUEST_ID_CHARS} characters)",
            param="request_id",
        ) from None


def check_session_id(session_id: str) -> str:
    """A session id (the `x-session-id` header, gRPC `session_id`): it only picks a worker, so any printable text
    up to MAX_NAME_CHARS characters does."""
    if not session_id.isprintable() or len(session_id) > MAX_NAME_CHARS:
        raise BadRequestError(
            f"the session id must be printable text of at most {MAX_NAME_CHARS} characters", param="session_id"
        )
    return session_id


def check_prompt_size(num_chars: int, context_len: int) -> None:
    """Refuse a prompt that cannot fit `context_len` tokens by its length alone (0 = context unknown: no bound)."""
    limit = max_prompt_chars(context_len)
    if context_len > 0 and num_chars > limit:
        raise BadRequestError(
            f"the prompt has {num_chars} characters, more than this model's maximum context length of {context_len} "
            f"tokens can hold (at most {limit} characters at {MAX_CHARS_PER_TOKEN} per token): shorten the prompt",
            param="prompt",
            code="context_length_exceeded",
        )
