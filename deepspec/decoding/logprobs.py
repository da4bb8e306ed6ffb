"""Log-probabilities of emitted (or prompt) tokens, read off logits the target has already computed.

The verify pass scores [pending token, drafts] for every row, so the logits that decided each committed token are
already there: accepted draft j was scored by row position j, the recovered or bonus token by the position after the
last accepted draft (a tree's by its accepted path). This module only gathers those rows, takes log_softmax in
fp32 and the top-N by `topk`: no extra forward, and nothing at all for requests that asked for no logprobs.

The distribution is the target's raw one (the model's logits, before temperature, top-k or top-p), as vLLM's
default `logprobs_mode=raw_logprobs`: a token's logprob does not depend on how it was sampled, and prompt scoring
(echo + logprobs) gives the same numbers as a log-likelihood evaluation of the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: the most alternatives a request may ask for per position (OpenAI's top_logprobs bound)
MAX_TOP_LOGPROBS = 20


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
