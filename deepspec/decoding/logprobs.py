"""Log-probabilities of emitted (or prompt) tokens, read off logits the target has already computed.

The verify pass scores [pending token, drafts] for every row, so the logits that decided each committed token are
already there: accepted draft j was scored by row position j, the recovered or bonus token by the position after the
last accepted draft (a tree's by its accepted path). This module only gathers those rows, takes log_softmax in
fp32 and the top-N by `topk`: no extra forward, and nothing at all for requests that asked for no logprobs.

By default the distribution is the target's raw one (the model's logits, before temperature, top-k or top-p), as
vLLM's default `logprobs_mode=raw_logprobs`: a token's logprob does not depend on how it was sampled, and prompt
scoring (echo + logprobs) gives the same numbers as a log-likelihood evaluation of the model. A request may ask for
`processed_logprobs` instead: the distribution its tokens were sampled from, the logits divided by the temperature
(1 for a greedy request) with the tokens outside its top-k and top-p set at -inf (`processed_logits`, the sampling
ops' own processing). Both are cheap: the processed mode adds one processing pass over the scored positions only.
Prompt logprobs are always raw (nothing samples the prompt). A structured-output request's logits are masked by its
grammar in both modes: what the target may emit there is only what the grammar allows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from plugins.reference.logits import process, scale

#: the most alternatives a request may ask for per position (OpenAI's top_logprobs bound)
MAX_TOP_LOGPROBS = 20
#: the distributions a request's logprobs may be of (vLLM's `logprobs_mode` values that are logprobs)
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")


@dataclass(frozen=True)
class TokenLogprob:
    """One position: the token that was emitted (or given) there, its logprob, and the likeliest alternatives."""

    token_id: int
    logprob: float
    #: the top-N token ids by logprob, likeliest first (N = the request's logprobs; empty for N = 0)
    top_token_ids: tuple[int, ...] = ()
    #: their logprobs, aligned with top_token_ids
    top_logprobs: tuple[float, ...] = ()


def token_logprobs(
    logits: torch.Tensor,  # [N, V] the logits that predicted each token
    token_ids: torch.Tensor,  # [N] int64, the token at each position
    num_top: int,
) -> list[TokenLogprob]:
    """[N] each token's raw logprob and the top-`num_top` alternatives, computed in fp32."""
    assert logits.ndim == 2 and token_ids.shape == logits.shape[:1]
    logp = torch.log_softmax(logits.float(), dim=-1)
    chosen = logp.gather(1, token_ids.to(logp.device)[:, None])[:, 0].tolist()
    ids = token_ids.tolist()
    if num_top <= 0:
        return [TokenLogprob(t, lp) for t, lp in zip(ids, chosen)]
    top = logp.topk(min(num_top, logp.shape[1]), dim=-1)
    top_vals, top_ids = top.values.tolist(), top.indices.tolist()
    return [TokenLogprob(t, lp, tuple(ti), tuple(tv)) for t, lp, ti, tv in zip(ids, chosen, top_ids, top_vals)]


def processed_logits(
    logits: torch.Tensor,  # [N, V]
    temperature: torch.Tensor,  # [N] float32, 0 = greedy (scored at 1)
    top_k: torch.Tensor,  # [N] int64, 0 = off
    top_p: torch.Tensor,  # [N] float32, 1 = off
) -> torch.Tensor:
    """[N, V] fp32 logits whose softmax is the distribution each row samples from, kept in log space (a token far
    in the tail keeps its logprob instead of underflowing to -inf): the sampling ops' own definitions
    (plugins/reference/logits.py: temperature, then top-k, then top-p as one keep threshold), at temperature 1 for
    greedy rows, whose sampled distribution is a point mass; a token outside the row's top-k or nucleus is -inf."""
    z = scale(logits, temperature.float())
    keep = process(z, top_k, top_p.float()).tau
    return z.masked_fill(z < keep[:, None], float("-inf"))


def scored_logits(logits: torch.Tensor, params: list) -> torch.Tensor:
    """[N, V] the logits to score position i by, for the request whose SamplingParams are params[i] (this module sits
    below params.py, which imports it: the type stays unnamed here): its raw logits, or
    processed (`processed_logits`) where it asked for logprobs_mode processed_logprobs."""
    rows = [i for i, p in enumerate(params) if p.logprobs_mode == "processed_logprobs"]
    if not rows:
        return logits
    index = torch.tensor(rows, device=logits.device)
    picked = [params[i] for i in rows]
    out = logits.float().clone()
    out[index] = processed_logits(
        logits[index],
        torch.tensor([p.temperature for p in picked], dtype=torch.float32, device=logits.device),
        torch.tensor([p.top_k for p in picked], dtype=torch.int64, device=logits.device),
        torch.tensor([p.top_p for p in picked], dtype=torch.float32, device=logits.device),
    )
    return out


def emitted_logprobs(
    logits: torch.Tensor, params: list, positions: list[list[int]], committed: list[list[int]]
) -> list[list[TokenLogprob] | None]:
    """Per row (params [B]: its SamplingParams) that asked for logprobs, its committed tokens' logprobs from a verify
    pass's logits [B, T, V] at `positions` (the position that predicted each committed token); None for the other
    rows, at no cost."""
    rows = [i for i, s in enumerate(params) if s.logprobs is not None]
    result: list[list[TokenLogprob] | None] = [None] * len(committed)
    if not rows:
        return result
    row_index = torch.tensor([i for i in rows for _ in positions[i]], device=logits.device)
    pos_index = torch.tensor([p for i in rows for p in positions[i]], device=logits.device)
    tokens = torch.tensor([t for i in rows for t in committed[i]])
    num_top = max(params[i].logprobs for i in rows)
    flat = token_logprobs(
        scored_logits(logits[row_index, pos_index], [params[i] for i in rows for _ in positions[i]]), tokens, num_top
    )
    at = 0
    for i in rows:
        n, keep = len(committed[i]), params[i].logprobs
        result[i] = [
            TokenLogprob(lp.token_id, lp.logprob, lp.top_token_ids[:keep], lp.top_logprobs[:keep])
            for lp in flat[at : at + n]
        ]
        at += n
    return result
