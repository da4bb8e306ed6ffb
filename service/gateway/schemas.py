"""OpenAI request bodies the gateway accepts (pydantic, strict types) and their mapping to a worker request.

Strict: `"max_tokens": "5"` is a 400, as at OpenAI. Fields OpenAI defines that DeepSpec does not implement are
accepted only at their neutral value (n=1, logprobs off, echo off, penalties 0), and rejected otherwise with a
message naming the field; unknown fields are ignored, as OpenAI and vLLM do. `top_k` and `ignore_eos` are vLLM's
extensions.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

_MAX_INT32 = 2**31 - 1


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    include_usage: bool = False


class _SamplingFields(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    model: str | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    #: vLLM extension; -1 or 0 = off
    top_k: int | None = Field(None, ge=-1, le=_MAX_INT32)
    seed: int | None = Field(None, ge=0, lt=2**64)
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    #: vLLM extension: keep generating past EOS (benchmarks)
    ignore_eos: bool = False
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logprobs: bool | int | None = None

    @model_validator(mode="after")
    def _check_unsupported(self):
        if self.n != 1:
            raise ValueError("n must be 1: DeepSpec returns one choice per request (send n requests instead)")
        if self.presence_penalty or self.frequency_penalty:
            raise ValueError("presence_penalty and frequency_penalty are not supported (leave them 0)")
        if self.logprobs:
            raise ValueError("logprobs are not supported")
        if isinstance(self.stop, list) and (len(self.stop) > 16 or any(not s for s in self.stop)):
            raise ValueError("stop takes up to 16 non-empty strings")
        if self.stop == "":
            raise ValueError("stop must be non-empty")
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
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "top_k": max(self.top_k or 0, 0),
            "seed": self.seed,
            "stop": stop,
            "ignore_eos": self.ignore_eos,
        }


class CompletionRequest(_SamplingFields):
    prompt: str | list[str]
    #: OpenAI's default for completions is 16
    max_tokens: int | None = Field(16, ge=1, le=_MAX_INT32)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

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
    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    #: None = as many as fit in the context (vLLM's default), decided by the worker
    max_tokens: int | None = Field(None, ge=1, le=_MAX_INT32)
    max_completion_tokens: int | None = Field(None, ge=1, le=_MAX_INT32)

    def messages_dicts(self) -> list[dict]:
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]
