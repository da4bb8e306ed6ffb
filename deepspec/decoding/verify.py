"""Verification: which draft tokens the target accepts, and the token it adds itself.

Words used throughout (after vLLM's rejection_sampler, arXiv 2211.17192): *accepted* draft tokens survive
verification; the *recovered* token replaces the first rejected draft (sampled from the residual
normalize(max(0, p - q))); the *bonus* token follows a fully accepted block (sampled from p). Each round commits
accepted + 1 tokens, so the output distribution is exactly the target's.

The work happens in the batched ops of `plugins` (torch.ops.deepspec.*: vectorized torch on CPU, Triton kernels
on CUDA); this module turns a batch of requests into their inputs. Randomness is counter-based: each row gets a
fresh seed per step, drawn from its request's generator, so a row's draws depend on nothing but its request's seed
and the rounds it takes. How many drafts a round verifies depends on the batch and the engine's step-time model (a
start-up probe, or the curve an ONNX export recorded on this machine), so a seeded sampled request replays exactly
only on the same engine and batch; greedy rows draw nothing and always equal
target-only greedy decoding (service/DESIGN.md, "Seeds and replay"; tests/deepspec/decoding/test_replay.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import plugins
from deepspec.decoding.params import SamplingParams
from plugins.reference.accept import on_host


def fresh_seed(generator: torch.Generator | None) -> int:
    """One 62-bit seed drawn from a request's generator: a verify step's, a round's drafts', a request's own."""
    return int(torch.randint(2**62, (1,), generator=generator))


@dataclass
class RowSampling:
    """Per-row sampling parameters of one verify step, as the ops take them."""

    temperature: torch.Tensor  # [B] float32, 0 = greedy row
    top_k: torch.Tensor  # [B] int64, 0 = off
    top_p: torch.Tensor  # [B] float32, 1 = off
    seeds: torch.Tensor  # [B] int64, fresh for every step

    @classmethod
    def draw(
        cls, params: list[SamplingParams], generators: list[torch.Generator | None], device: torch.device | str = "cpu"
    ) -> RowSampling:
        seeds = [fresh_seed(g) for g in generators]
        return cls(
            torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device),
            torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device),
            torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
            torch.tensor(seeds, dtype=torch.int64, device=device),
        )


def verify(
    draft_tokens: torch.Tensor,  # [B, k] int64
    num_draft_tokens: torch.Tensor,  # [B] int64, real drafts per row (0..k)
    target_logits: torch.Tensor,  # [B, k+1, V] the target's logits at [last token, drafts]
    draft_probs: torch.Tensor | None,  # [B, k, V] the q each draft was drawn from; None = deterministic drafts
    sampling: RowSampling | None,  # None = every row greedy
) -> tuple[torch.Tensor, torch.Tensor]:
    """→ (num_accepted [B], next_token [B]) on the logits' device; greedy rows are exactly target argmax."""
    if _walks_on_host(target_logits, draft_probs, sampling):  # the host walks read no draft past its row's count
        num_accepted, next_token = _host_walk(draft_tokens, num_draft_tokens, target_logits, draft_probs, sampling)
        return torch.tensor(num_accepted, dtype=torch.long), torch.tensor(next_token, dtype=torch.long)
    device = target_logits.device
    draft_tokens, num_draft_tokens = draft_tokens.to(device), num_draft_tokens.to(device)
    # drafters pad past num_draft_tokens with anything; a kernel may read a padded slot, so padding becomes token 0
    padding = torch.arange(draft_tokens.shape[1], device=device)[None, :] >= num_draft_tokens[:, None]
    draft_tokens = draft_tokens.masked_fill(padding, 0)
    if sampling is None:
        return plugins.greedy_accept(draft_tokens, num_draft_tokens, target_logits)
    if draft_probs is not None:
        draft_probs = draft_probs.to(device)
    return plugins.rejection_sample(
        draft_tokens,
        num_draft_tokens,
        target_logits,
        draft_probs,
        sampling.temperature,
        sampling.top_k,
        sampling.top_p,
        sampling.seeds,
    )


def verify_result(
    draft_tokens: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    draft_probs: torch.Tensor | None,
    sampling: RowSampling | None,
) -> list[list[int]]:
    """`verify` (same arguments) read back to the host: per row [num_accepted, next_token, *draft_tokens]. Greedy
    rows on host logits take the walk's own lists, with no tensors built, concatenated and read back (~0.1 ms of a
    batch-1 round on the native decoder); so do sampled rows (plugins.rejection_sample_host)."""
    if _walks_on_host(target_logits, draft_probs, sampling):
        num_accepted, next_token = _host_walk(draft_tokens, num_draft_tokens, target_logits, draft_probs, sampling)
        return [[a, t, *d] for a, t, d in zip(num_accepted, next_token, draft_tokens.tolist())]
    num_accepted, next_token = verify(draft_tokens, num_draft_tokens, target_logits, draft_probs, sampling)
    return torch.cat(
        [num_accepted[:, None], next_token[:, None], draft_tokens.to(num_accepted.device, torch.long)], dim=1
    ).tolist()


def _walks_on_host(target_logits: torch.Tensor, draft_probs: torch.Tensor | None, sampling: RowSampling | None) -> bool:
    """Logits (and draft probabilities, and sampling parameters) in host memory: the ops' host walks take them."""
    return (
        on_host(target_logits)
        and (draft_probs is None or draft_probs.device.type == "cpu")
        and (sampling is None or sampling.seeds.device.type == "cpu")
    )


def _host_walk(draft_tokens, num_draft_tokens, target_logits, draft_probs, sampling) -> tuple[list[int], list[int]]:
    if sampling is None:
        return plugins.greedy_accept_host(draft_tokens, num_draft_tokens, target_logits)
    return plugins.rejection_sample_host(
        draft_tokens,
        num_draft_tokens,
        target_logits,
        draft_probs,
        sampling.temperature,
        sampling.top_k,
        sampling.top_p,
        sampling.seeds,
    )


def verify_tree(
    tree_tokens: torch.Tensor,  # [B, N] int64: column 0 the root (the row's pending token), then the nodes
    parents: torch.Tensor,  # [B, N] int64: -1 at the root, parents[b, i] < i after it
    num_nodes: torch.Tensor,  # [B] int64 in [1, N], the root included
    target_logits: torch.Tensor,  # [B, N, V] the target's logits after each node (tree attention)
    draft_probs: torch.Tensor | None,  # [B, N, V] the q each node was drawn from (column 0 unused); None = one-hot
    sampling: RowSampling | None,  # None = every row greedy
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """→ (num_accepted [B], next_token [B], path [B, N]) on the logits' device: the accepted root-to-node path
    (path[b, j] = node at depth j, -1 past num_accepted) of each row; greedy rows take the first deepest path the
    target's argmax agrees with, sampled rows SpecInfer's multi-step walk (plugins/reference/tree.py)."""
    device = target_logits.device
    B, N = tree_tokens.shape
    tree_tokens, parents, num_nodes = tree_tokens.to(device), parents.to(device), num_nodes.to(device)
    padding = torch.arange(N, device=device)[None, :] >= num_nodes[:, None]
    tree_tokens = tree_tokens.masked_fill(padding, 0)
    if sampling is None:
        sampling = RowSampling(
            torch.zeros(B, dtype=torch.float32, device=device),
            torch.zeros(B, dtype=torch.int64, device=device),
            torch.ones(B, dtype=torch.float32, device=device),
            torch.zeros(B, dtype=torch.int64, device=device),
        )
    if draft_probs is not None:
        draft_probs = draft_probs.to(device)
    return plugins.tree_accept(
        tree_tokens,
        parents,
        num_nodes,
        target_logits,
        draft_probs,
        sampling.temperature,
        sampling.top_k,
        sampling.top_p,
        sampling.seeds,
    )


def sample_next(
    logits: torch.Tensor,  # [B, V] the target's logits after each row's last token
    sampling: RowSampling,
) -> torch.Tensor:
    """[B] one token per row from the processed target distribution (a verify step with no drafts)."""
    B = logits.shape[0]
    no_drafts = torch.zeros(B, 0, dtype=torch.int64, device=logits.device)
    return verify(no_drafts, torch.zeros(B, dtype=torch.int64), logits[:, None], None, sampling)[1]
