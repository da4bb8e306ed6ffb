"""The two records every part of the load tester shares: what to send, and what happened.

No behaviour lives here. Workloads produce `RequestInput`s, clients turn one into a `RequestOutput`, and
`metrics.py` reduces a list of outputs to numbers. All times are `time.perf_counter()` seconds, so they
are only meaningful relative to each other within one process.

Words, used the same way in code, report and `--help`:
  TTFT  time from sending the request to the first chunk that carries output text.
  ITL   inter-token latency: the gap between two successive output-carrying chunks. With speculative
        decoding a chunk may hold several tokens, so ITL is per chunk, not per token.
  TPOT  time per output token after the first: (e2e - TTFT) / (output tokens - 1).
  e2e   time from sending the request to the end of the response.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestInput:
    """One request, independent of the wire protocol."""

    #: raw prompt text (completions, gRPC `prompt`); also the user turn for chat.
    prompt: str
    #: chat messages; None means `[{"role": "user", "content": prompt}]`.
    messages: list[dict[str, str]] | None = None
    #: tokens the prompt is expected to have, when the workload knows (random workload); else None.
    prompt_len: int | None = None
    #: the `max_tokens` sent; None lets the server decide.
    max_tokens: int | None = None
    #: ask the server to ignore end-of-sequence (vLLM and DeepSpec extension; OpenAI proper rejects it).
    ignore_eos: bool = False
    temperature: float | None = 0.0


@dataclass(slots=True)
class RequestOutput:
    """What one request measured. Failed requests keep `error_kind` and whatever timing they reached."""

    success: bool = False
    #: short machine-readable kind for error counts: "connect", "timeout", "http_429", "malformed_sse", ...
    error_kind: str | None = None
    error: str = ""
    #: perf_counter() when the request was sent.
    start_time: float = 0.0
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    #: gaps between successive output-carrying chunks, seconds.
    itl_s: list[float] = field(default_factory=list)
    #: prompt tokens as reported by the server's usage, else the workload's estimate, else 0.
    prompt_tokens: int = 0
    #: completion tokens as reported by the server's usage, else the number of output-carrying chunks.
    output_tokens: int = 0
    #: True when output_tokens came from the server's usage block rather than a chunk count.
    usage_reported: bool = False
    generated_text: str = ""

    @property
    def tpot_s(self) -> float | None:
        """(e2e - TTFT) / (output tokens - 1); None when fewer than two tokens were produced."""
        if not self.success or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)
