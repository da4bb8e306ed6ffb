"""The scripted TensorRT-LLM of tests/kserve_triton.py, scoring what it generates as TensorRT-LLM's LLM API does.

TensorRT-LLM (tensorrt_llm/executor/result.py): `CompletionOutput.logprobs` is a `LogprobResults`, one dict per
generated token, token id -> `Logprob(logprob, rank)`, filled step by step on the one CompletionOutput the request
keeps; `compute_logprobs` puts the `SamplingParams.logprobs` likeliest tokens in each dict (rank 1 the likeliest)
and adds the sampled token where it is not among them. Its tokenizer decodes ids (`decode(ids, skip_special_tokens)`).

Here step i generates token `100 + i` (text WORDS[i]), which is always the runner-up: token `200 + i` is likelier.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.kserve_triton import WORDS, Completion, GenerationResult


@dataclass(frozen=True)
class Logprob:
    """tensorrt_llm/executor/result.py Logprob."""

    logprob: float
    rank: int


def distribution(step: int) -> list[tuple[int, float]]:
    """Step `step`'s (token id, logprob) pairs, likeliest first; the sampled token 100 + step is second."""
    return [(200 + step, -0.05), (100 + step, -0.1 * (step + 1)), (300 + step, -2.0 - step), (400 + step, -4.0 - step)]


def text_of(token: int) -> str:
    return WORDS[(token - 100) % len(WORDS)] if 100 <= token < 200 else f"<alt{token}>"


class ScoredCompletion(Completion):
    """A CompletionOutput with its `logprobs` (empty until scored, as TensorRT-LLM's default)."""

    def __init__(self):
        super().__init__()
        self.logprobs: list[dict[int, Logprob]] = []


class ScoredResult(GenerationResult):
    """A GenerationResult whose CompletionOutput also carries `logprobs`, as TensorRT-LLM fills it."""

    def __init__(self, prompt: str, params, prompt_token_ids: list[int]):
        super().__init__(prompt, params, prompt_token_ids)
        self.outputs = [ScoredCompletion()]

    def _step(self) -> None:
        super()._step()
        out, step = self.outputs[0], self.num_steps - 1
        assert isinstance(out, ScoredCompletion)
        if getattr(self.params, "logprobs", None):
            ranked = distribution(step)
            scored = {token: Logprob(lp, rank + 1) for rank, (token, lp) in enumerate(ranked[: self.params.logprobs])}
            sampled = out.token_ids[-1]
            scored.setdefault(sampled, Logprob(dict(ranked)[sampled], [t for t, _ in ranked].index(sampled) + 1))
            out.logprobs = [*out.logprobs, scored]


def score(llm) -> None:
    """Make the scripted `llm` score its tokens and its tokenizer decode them."""
    llm.tokenizer.decode = lambda ids, skip_special_tokens=False: "".join(text_of(t) for t in ids)

    def generate_async(prompt, params, streaming=False):
        llm.calls.append((prompt, params, streaming))
        return ScoredResult(prompt, params, list(range(len(prompt))))

    llm.generate_async = generate_async
