"""Input checks shared by every implementation: shapes and dtypes always, values where they are free to read.

Shapes and dtypes are checked on every path (the fake implementations too, so torch.export fails early). Values
(draft counts within k, token ids within V, parents before children) are checked on CPU only: reading them on a
GPU would cost a host sync per step, so the kernels clamp counts and treat an out-of-range token as rejected.
"""

from __future__ import annotations

import torch

INT = (torch.int64,)


class OpInputError(ValueError):
    """An op was called with inputs that do not fit its contract; the message names the op and the input."""


def _fail(op: str, msg: str) -> None:
    raise OpInputError(f"deepspec::{op}: {msg}")


def tensor(op: str, name: str, x, ndim: int, dtypes: tuple[torch.dtype, ...] | None = None) -> None:
    if not isinstance(x, torch.Tensor):
        _fail(op, f"{name} must be a tensor, got {type(x).__name__}")
    if x.dim() != ndim:
        _fail(op, f"{name} must have {ndim} dims, got shape {tuple(x.shape)}")
    if dtypes is None:
        if not x.is_floating_point():
            _fail(op, f"{name} must be a floating tensor, got {x.dtype}")
    elif x.dtype not in dtypes:
        _fail(op, f"{name} must be {' or '.join(str(d) for d in dtypes)}, got {x.dtype}")


def same(op: str, what: str, *sizes) -> None:
    if len({int(s) for s in sizes}) > 1:
        _fail(op, f"{what} disagree: {', '.join(str(int(s)) for s in sizes)}")


def sampling(op: str, B: int, temperature, top_k, top_p, seeds=None) -> None:
    tensor(op, "temperature", temperature, 1, (torch.float32,))
    tensor(op, "top_k", top_k, 1, INT)
    tensor(op, "top_p", top_p, 1, (torch.float32,))
    if seeds is not None:
        tensor(op, "seeds", seeds, 1, INT)
    same(
        op,
        "batch sizes of temperature, top_k, top_p, seeds and the logits",
        temperature.shape[0],
        top_k.shape[0],
        top_p.shape[0],
        B,
        *([] if seeds is None else [seeds.shape[0]]),
    )
    if _readable(top_k) and any(k < 0 for k in top_k.tolist()):
        _fail(op, "top_k must be >= 0 (0 = off)")
    if _readable(top_p) and not all(0 < p <= 1 for p in top_p.tolist()):  # a NaN fails too
        _fail(op, "top_p must be in (0, 1] (1 = off)")


# Value checks read small host tensors as Python ints: a few tensor ops each cost more than the read, and after a
# target forward has streamed the weights through the caches every distinct torch op runs cold (tens of us).
def counts(op: str, name: str, n, low: int, high: int) -> None:
    if _readable(n) and n.numel():
        values = n.tolist()
        if min(values) < low or max(values) > high:
            _fail(op, f"{name} must be in [{low}, {high}], got {values}")


def token_ids(op: str, name: str, tokens, vocab: int, live=None) -> None:
    """Every id in [0, vocab); of a [B, k] tensor with `live` [B] counts, only each row's first live[b] ids (what
    lies past them is padding the ops never read)."""
    if not _readable(tokens) or not tokens.numel():
        return
    rows = tokens.tolist() if tokens.dim() > 1 else [tokens.tolist()]
    if live is not None:
        rows = [row[:n] for row, n in zip(rows, live.tolist())]
    if any(t < 0 or t >= vocab for row in rows for t in row):
        _fail(op, f"{name} must be token ids in [0, {vocab})")


def _readable(x: torch.Tensor) -> bool:
    """Values are checked where reading them costs no device sync and the tensor is real (not fake)."""
    return x.device.type == "cpu" and not isinstance(x, torch._subclasses.FakeTensor)


def chain(op: str, draft_tokens, num_draft_tokens, target_logits, draft_probs=None) -> None:
    tensor(op, "draft_tokens", draft_tokens, 2, INT)
    tensor(op, "num_draft_tokens", num_draft_tokens, 1, INT)
    tensor(op, "target_logits", target_logits, 3)
    B, k = draft_tokens.shape
    same(
        op,
        "batch sizes of draft_tokens, num_draft_tokens and target_logits",
        B,
        num_draft_tokens.shape[0],
        target_logits.shape[0],
    )
    if target_logits.shape[1] != k + 1:
        _fail(op, f"target_logits must hold k+1 = {k + 1} positions per row, got {target_logits.shape[1]}")
    V = target_logits.shape[2]
    if V < 1:
        _fail(op, "the vocabulary is empty")
    if draft_probs is not None:
        tensor(op, "draft_probs", draft_probs, 3)
        if tuple(draft_probs.shape) != (B, k, V):
            _fail(op, f"draft_probs must be [B, k, V] = {[B, k, V]}, got {list(draft_probs.shape)}")
    counts(op, "num_draft_tokens", num_draft_tokens, 0, k)
    token_ids(op, "draft_tokens", draft_tokens, V, live=num_draft_tokens)


def tree(op: str, tree_tokens, parents, num_nodes, target_logits, draft_probs=None) -> None:
    tensor(op, "tree_tokens", tree_tokens, 2, INT)
    tensor(op, "parents", parents, 2, INT)
    tensor(op, "num_nodes", num_nodes, 1, INT)
    tensor(op, "target_logits", target_logits, 3)
    B, N = tree_tokens.shape
    if N < 1:
        _fail(op, "a tree has at least its root node")
    if tuple(parents.shape) != (B, N) or tuple(target_logits.shape[:2]) != (B, N):
        _fail(
            op,
            f"parents [B, N] and target_logits [B, N, V] must match tree_tokens [B, N] = {[B, N]}, got "
            f"{list(parents.shape)} and {list(target_logits.shape)}",
        )
    same(op, "batch sizes of num_nodes and tree_tokens", num_nodes.shape[0], B)
    V = target_logits.shape[2]
    if draft_probs is not None:
        tensor(op, "draft_probs", draft_probs, 3)
        if tuple(draft_probs.shape) != (B, N, V):
            _fail(op, f"draft_probs must be [B, N, V] = {[B, N, V]}, got {list(draft_probs.shape)}")
    counts(op, "num_nodes", num_nodes, 1, N)
    if _readable(parents) and N > 1:
        idx = torch.arange(1, N)
        live = idx[None, :] < num_nodes[:, None]
        bad = live & ((parents[:, 1:] < 0) | (parents[:, 1:] >= idx[None, :]))
        if bool(bad.any()):
            _fail(op, "parents must list each node after its parent: 0 <= parents[b, i] < i for 1 <= i < num_nodes")
    if _readable(tree_tokens):
        live = torch.arange(N)[None, :] < num_nodes[:, None]
        token_ids(op, "tree_tokens", tree_tokens[live], V)
