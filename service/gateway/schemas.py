"""OpenAI request bodies the gateway accepts (pydantic, strict types) and their mapping to a worker request.

Strict: `"max_tokens": "5"` is a 400, as at OpenAI. Nothing is silently ignored: fields OpenAI defines that DeepSpec
does not implement (n, logprobs, echo, penalties, response_format, tools, logit_bias, ...) are accepted only at
their neutral value and refused otherwise with a message naming the field, and an unknown field is a 400 naming it
(OpenAI answers "Unrecognized request argument"; vLLM would drop it with a log line, and a client asking for JSON
output would get free text). `top_k` and `ignore_eos` are vLLM's extensions. Field types and limits come from
`validation.py`; the gRPC API validates through these models too.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.gateway.validation import (Integer, MaxTokens, Name, OnePrompt, Prompt, Seed, StopString, StopStrings,
                                        Temperature, Text, TopK, TopP, neutral_only)  # fmt: skip


_MIN_NORMAL_FP32 = 1.1754943508222875e-38


#: every request object: strict types, unknown fields refused
_STRICT = ConfigDict(strict=True, extra="forbid")


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool = False


class ResponseFormat(BaseModel):
    """Only the neutral `{"type": "text"}`: constrained decoding is not implemented, so JSON modes are refused."""
    model_config = _STRICT
    type: Literal["text"]


class _SamplingFields(BaseModel):
    model_config = _STRICT

    model: Name | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    #: vLLM extension; -1 or 0 = off
    top_k: TopK | None = None
    seed: Seed | None = None
    stop: StopString | StopStrings | None = None
    n: Annotated[int, Integer, neutral_only(1)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: Name | None = None
    #: vLLM extension: keep generating past EOS (benchmarks)
    ignore_eos: bool = False
    presence_penalty: Annotated[float | None, neutral_only(0, None)] = None
    frequency_penalty: Annotated[float | None, neutral_only(0, None)] = None
    logprobs: Annotated[bool | int | None, neutral_only(False, 0, None)] = None
    logit_bias: Annotated[dict[str, float] | None, neutral_only({}, None)] = None
    response_format: ResponseFormat | None = None

    @model_validator(mode="after")
    def _check_unsupported(self):
        if self.logit_bias:
            raise ValueError("logit_bias is not supported (leave it out)")
        if self.n != 1:
            raise ValueError("n must be 1: DeepSpec returns one choice per request (send n requests instead)")
        if self.presence_penalty or self.frequency_penalty:
            raise ValueError("presence_penalty and frequency_penalty are not supported (leave them 0)")
        if self.logprobs:
            raise ValueError("logprobs are not supported")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def sampling(self) -> dict:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return {
            "temperature": 1.0 if self.temperature is None else self.temperature,
            # FP32 on the wire: a top_p below float32's smallest normal would reach the worker as 0, which it refuses
            "top_p": 1.0 if self.top_p is None else max(self.top_p, _MIN_NORMAL_FP32),
            "top_k": max(self.top_k or 0, 0),
            "seed": self.seed,
            "stop": stop,
            "ignore_eos": self.ignore_eos,
        }


class CompletionRequest(_SamplingFields):
    prompt: Prompt | OnePrompt
    #: OpenAI's default for completions is 16
    max_tokens: MaxTokens | None = 16
    echo: Annotated[bool, neutral_only(False)] = False
    suffix: Annotated[str | None, neutral_only("", None)] = None
    best_of: Annotated[int | None, Integer, neutral_only(1, None)] = None

    @model_validator(mode="after")
    def _check_prompt(self):
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise ValueError("prompt must be a string or a list of exactly one string (batches: send several requests)")
        if self.echo or self.suffix or (self.best_of not in (None, 1)):
            raise ValueError("echo, suffix and best_of are not supported")
        return self

    @property
    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


class TextPart(BaseModel):
    model_config = _STRICT
    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    model_config = _STRICT
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    #: None = as many as fit in the context (vLLM's default), decided by the worker
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    top_logprobs: Annotated[int | None, Integer, neutral_only(0, None)] = None
    #: tool calls are not implemented: only "no tools" is accepted
    tools: Annotated[list | None, Field(max_length=0), neutral_only([], None)] = None
    tool_choice: Annotated[Literal["none"] | None, neutral_only("none", None)] = None
    parallel_tool_calls: bool | None = None

    @model_validator(mode="after")
    def _check_unsupported_chat(self):
        if self.top_logprobs:
            raise ValueError("top_logprobs is not supported (leave it out)")
        return self

    def messages_dicts(self) -> list[dict]:
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]
