"""Scored tokens on the wire: one `TokenScore` per token, written by the worker and read by the gateway as the
columns of a `ScoreTensors` table (deepspec_protocol/worker.py).

A token travels with its text because the gateway has no tokenizer: it renders OpenAI's logprobs shapes (and the
gRPC API's) from these records alone. Rows are tokens; the alternatives are [n, k] tensors, so a table is
self-describing (k is read off the shape). Nothing here imports deepspec: the gateway image has no engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from deepspec_protocol import tensors
from deepspec_protocol.worker import ScoreTensors


@dataclass(frozen=True)
class TokenScore:
    """One scored token: its text, id and raw logprob (None for the prompt's first token, which nothing predicts),
    and the likeliest alternatives at its position, likeliest first."""

    token: str
    token_id: int
    logprob: float | None
    top_tokens: tuple[str, ...] = ()
    top_token_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()


def add_scores(response: tensors.ModelInferResponse, names: ScoreTensors, scores: list[TokenScore]) -> None:
    """Append `scores` as the table `names` (nothing for an empty list: the gateway reads absent as none)."""
    if not scores:
        return
    n = len(scores)
    _add(response, names.log_probs, "FP32", [math.nan if s.logprob is None else s.logprob for s in scores], [1, n])
    _add(response, names.token_ids, "INT32", [s.token_id for s in scores], [1, n])
    _add(response, names.tokens, "BYTES", [s.token for s in scores], [1, n])
    k = max(len(s.top_token_ids) for s in scores)
    if k:
        rows = [
            s if len(s.top_token_ids) == k else TokenScore("", -1, None, ("",) * k, (-1,) * k, (math.nan,) * k)
            for s in scores
        ]
        _add(response, names.top_log_probs, "FP32", [v for s in rows for v in s.top_logprobs], [n, k])
        _add(response, names.top_token_ids, "INT32", [v for s in rows for v in s.top_token_ids], [n, k])
        _add(response, names.top_tokens, "BYTES", [v for s in rows for v in s.top_tokens], [n, k])


def read_scores(
    response: tensors.ModelInferResponse, values: dict[str, list], names: ScoreTensors
) -> list[TokenScore] | None:
    """The table `names` of a response whose outputs read as `values` (`tensors.read_outputs`), or None when it has
    none; `tensors.TensorError` when it is malformed."""
    if names.log_probs not in values:
        return None
    logprobs, ids = values[names.log_probs], values.get(names.token_ids, [])
    texts = tensors.strings(values, names.tokens)
    n = len(logprobs)
    if len(ids) != n or len(texts) != n:
        raise tensors.TensorError(f"the scored-token table {names.log_probs!r} has columns of different lengths")
    shape = {t.name: list(t.shape) for t in response.outputs}.get(names.top_log_probs, [n, 0])
    k = shape[-1] if len(shape) == 2 and shape[0] == n else -1
    top = [
        values.get(names.top_log_probs, []),
        values.get(names.top_token_ids, []),
        tensors.strings(values, names.top_tokens),
    ]
    if k < 0 or any(len(column) != n * k for column in top):
        raise tensors.TensorError(f"the alternatives of {names.log_probs!r} are not an [{n}, k] table")
    scores = []
    for i in range(n):
        if math.isnan(logprobs[i]):  # nothing predicts this token: no logprob, no alternatives
            scores.append(TokenScore(texts[i], ids[i], None))
            continue
        row = slice(i * k, (i + 1) * k)
        scores.append(
            TokenScore(texts[i], ids[i], logprobs[i], tuple(top[2][row]), tuple(top[1][row]), tuple(top[0][row]))
        )
    return scores


def _add(response, name: str, datatype: str, values: list, shape: list[int]) -> None:
    response.outputs.add(name=name, datatype=datatype, shape=shape)
    response.raw_output_contents.append(tensors.encode(datatype, values))
