"""Per-request speculation control: the `speculation` extension field of both OpenAI routes and its gRPC twin.

`{"mode": "auto" | "off", "max_draft_tokens": n}`: `auto` (the default) leaves the depth to the worker, capped at n
draft tokens per verify round when n is given; `off` decodes the request with the target alone (a client that
wants plain decoding, or one measuring what speculation buys). n = 0 is `off` said another way; `off` with n > 0
contradicts itself and is a 400. Greedy output is the same in every mode: speculation only changes how many target
tokens a round commits, never which (docs/ARCHITECTURE.md).

The result is one number, `GenerationRequest.max_draft_tokens` (None = the worker's setting), which DeepSpec's
worker reads as `SamplingParams.max_draft_tokens`. An OpenAI-HTTP upstream gets it as far as it can take it
(`openai_client.py`: llama.cpp's server has a per-request `speculative.n_max`; vLLM, SGLang and trtllm-serve have
no per-request control, so a request that asks for anything but `auto` without a cap is refused there, never sent
and ignored).
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import BaseModel, Field, model_validator

from service.gateway.validation import STRICT, Integer

#: the deepest cap a request may ask for; the worker's own depth (num_speculative_tokens <= 32) bounds it anyway
MAX_DRAFT_TOKENS = 64
Mode = Literal["auto", "off"]
MODES = get_args(Mode)


class Speculation(BaseModel):
    model_config = STRICT

    #: "auto": the worker's depth control decides (capped by max_draft_tokens); "off": no draft for this request
    mode: Mode = "auto"
    #: draft tokens verified per round at most (0 = off); None = no cap of the request's own
    max_draft_tokens: Annotated[int, Field(ge=0, le=MAX_DRAFT_TOKENS), Integer] | None = None

    @model_validator(mode="after")
    def _check_consistent(self):
        if self.mode == "off" and self.max_draft_tokens:
            raise ValueError(
                f"speculation mode 'off' drafts nothing: leave max_draft_tokens out (or 0), or use mode "
                f"'auto' with max_draft_tokens {self.max_draft_tokens}"
            )
        return self

    def max_draft_tokens_cap(self) -> int | None:
        """The cap a worker is sent: 0 for off, the request's cap for auto, None for auto without one."""
        return 0 if self.mode == "off" else self.max_draft_tokens


def draft_cap(speculation: Speculation | None) -> int | None:
    """`GenerationRequest.max_draft_tokens` for a request's `speculation` field (None when it has none)."""
    return None if speculation is None else speculation.max_draft_tokens_cap()
