"""OpenAI request bodies the gateway accepts (pydantic, strict types) and their mapping to a worker request.

Strict: `"max_tokens": "5"` is a 400, as at OpenAI. Nothing is silently ignored: fields OpenAI defines that DeepSpec
does not implement (suffix, best_of, penalties, tools, logit_bias, ...) are accepted only at their neutral value
and refused otherwise with a message naming the field, and an unknown field is a 400 naming it (OpenAI answers
"Unrecognized request argument"; vLLM would drop it with a log line, and a client asking for something it does not
do would get a plain answer). `speculation` is DeepSpec's own (speculation.py); `top_k`, `ignore_eos` and
`logprobs_mode` are vLLM's extensions, and so are
completions' batches of prompts given as token ids (OpenAI takes them too), `logprobs` up to 20 and the
structured-output fields (`structured.py`: response_format, structured_outputs, guided_*).
tests/service/test_request_fields.py lists every field as honoured or refused, so a new one cannot be accepted
unread. Field types and limits come from `validation.py`; the gRPC API validates through these models too.
"""

from __future__ import annotations

from typing import Annotated, Literal, cast

from pydantic import BaseModel, Field, model_validator

from service.gateway.speculation import Speculation, draft_cap
from service.gateway.structured import StructuredOutputFields
from service.gateway.validation import (
    MAX_CHOICES,
    STRICT,
    CompletionMaxTokens,
    Integer,
    LogprobsMode,
    MaxTokens,
    Name,
    NumChoices,
    Prompt,
    Prompts,
    Seed,
    StopString,
    StopStrings,
    Temperature,
    Text,
    TokenIdBatch,
    TokenIds,
    TopK,
    TopLogprobs,
    TopP,
    neutral_only,
)

_MIN_NORMAL_FP32 = 1.1754943508222875e-38


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


class _SamplingFields(StructuredOutputFields):
    model_config = STRICT

    model: Name | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    #: vLLM extension; -1 or 0 = off
    top_k: TopK | None = None
    seed: Seed | None = None
    stop: StopString | StopStrings | None = None
    #: choices per prompt, each sampled on its own (greedy: n equal ones, as in vLLM); the worker prefills the
    #: prompt once for all of them, and the usage counts it once
    n: NumChoices = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: Name | None = None
    #: vLLM extension: keep generating past EOS (benchmarks)
    ignore_eos: bool = False
    #: vLLM's names: the generated tokens' logprobs are of the target's raw distribution ("raw_logprobs") or of the
    #: one each token was sampled from ("processed_logprobs": temperature, top-k, top-p applied); prompt logprobs
    #: are always raw. vLLM sets it per engine (--logprobs-mode), DeepSpec per request
    logprobs_mode: LogprobsMode = "raw_logprobs"
    presence_penalty: Annotated[float | None, neutral_only(0, None)] = None
    frequency_penalty: Annotated[float | None, neutral_only(0, None)] = None
    logit_bias: Annotated[dict[str, float] | None, neutral_only({}, None)] = None
    #: DeepSpec extension (the `openai` client sends it in `extra_body`): {"mode": "auto" | "off",
    #: "max_draft_tokens": n}, this request's speculation (speculation.py); unset = the worker's own
    speculation: Speculation | None = None

    @model_validator(mode="after")
    def _check_unsupported(self):
        if self.logit_bias:
            raise ValueError("logit_bias is not supported (leave it out)")
        if self.presence_penalty or self.frequency_penalty:
            raise ValueError("presence_penalty and frequency_penalty are not supported (leave them 0)")
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
            "structured_output": self.constraint,
            "n": self.n,
            "logprobs_mode": self.logprobs_mode,
            "max_draft_tokens": draft_cap(self.speculation),
            "session": self.user,
        }


class CompletionRequest(_SamplingFields):
    #: a text, a batch of texts, token ids or a batch of token-id lists: one choice per prompt, in order (vLLM)
    prompt: Prompt | Prompts | TokenIds | TokenIdBatch
    #: OpenAI's default for completions is 16; 0 generates nothing and only scores the prompt (with echo)
    max_tokens: CompletionMaxTokens | None = 16
    #: return the prompt before the completion, with logprobs the prompt's token logprobs too (prompt scoring)
    echo: bool = False
    #: each token's logprob and this many likeliest alternatives (OpenAI's legacy shape); None = off
    logprobs: TopLogprobs | None = None
    suffix: Annotated[str | None, neutral_only("", None)] = None
    #: vLLM's best_of (n of best_of sequences, the likeliest) is not implemented: only best_of = n is accepted
    best_of: Annotated[int | None, Field(ge=1, le=MAX_CHOICES), Integer] = None

    @model_validator(mode="after")
    def _check_prompt(self):
        if self.suffix:
            raise ValueError("suffix is not supported (leave it out)")
        if self.best_of not in (None, self.n):
            raise ValueError(
                f"best_of is not supported: leave it out, or equal to n ({self.n}); send n for several choices"
            )
        if len(self.prompts) * self.n > MAX_CHOICES:
            raise ValueError(
                f"n ({self.n}) choices for each of {len(self.prompts)} prompts is more than "
                f"{MAX_CHOICES} choices in one request: send the batch in parts"
            )
        if self.max_tokens == 0 and not self.echo:
            raise ValueError(
                "max_tokens 0 generates nothing: it only scores the prompt, with echo true (and "
                "logprobs for the prompt's logprobs; gRPC: prompt_logprobs)"
            )
        if self.stream and len(self.prompts) > 1:
            raise ValueError("stream takes one prompt: send the batch without stream, or one request per prompt")
        return self

    @property
    def prompts(self) -> list[str | list[int]]:
        """One entry per choice: a text or a list of token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if isinstance(prompt[0], int):  # validated as TokenIds: every item is a token id
            return [cast("list[int]", prompt)]
        return [*cast("list[str] | list[list[int]]", prompt)]

    def generation(self, prompt: str | list[int]) -> dict:
        """The GenerationRequest fields for one of `prompts`. Echo asks the worker for the prompt's scores when they
        are shown (logprobs), when only the worker can say the prompt's text (token ids), or when nothing else is
        asked (max_tokens 0)."""
        token_ids = isinstance(prompt, list)
        prompt_logprobs = None
        if self.echo and (self.logprobs is not None or token_ids or self.max_tokens == 0):
            prompt_logprobs = self.logprobs or 0
        return {
            "prompt": None if token_ids else prompt,
            "prompt_token_ids": prompt if token_ids else None,
            "max_tokens": self.max_tokens,
            "logprobs": self.logprobs,
            "prompt_logprobs": prompt_logprobs,
            **self.sampling(),
        }


class TextPart(BaseModel):
    model_config = STRICT
    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    model_config = STRICT
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    #: None = as many as fit in the context (vLLM's default), decided by the worker
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    #: return each generated token's logprob ...
    logprobs: bool | None = None
    #: ... and this many likeliest alternatives per position (needs logprobs)
    top_logprobs: TopLogprobs | None = None
    #: tool calls are not implemented: only "no tools" is accepted
    tools: Annotated[list | None, Field(max_length=0), neutral_only([], None)] = None
    tool_choice: Annotated[Literal["none"] | None, neutral_only("none", None)] = None
    parallel_tool_calls: bool | None = None

    @model_validator(mode="after")
    def _check_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true (as at OpenAI)")
        return self

    def generation(self) -> dict:
        """The GenerationRequest fields: the messages (developer is the system role), the token budget
        (max_completion_tokens before the deprecated max_tokens), the logprobs' alternatives (None without
        logprobs) and the sampling."""
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]
        return {
            "messages": messages,
            "max_tokens": self.max_completion_tokens or self.max_tokens,
            "logprobs": (self.top_logprobs or 0) if self.logprobs else None,
            **self.sampling(),
        }
