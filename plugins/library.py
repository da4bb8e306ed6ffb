"""`torch.ops.deepspec.*`: each op a torch.library op with a CPU, a CUDA and a fake implementation.

- CPU (and any device without a kernel): the vectorized torch reference in plugins/reference/.
- CUDA: the Triton kernels of plugins/kernels/ (one launch per op); without triton installed the reference runs
  on the GPU instead, with one warning.
- Fake: output shapes and dtypes only, so torch.compile and torch.export trace through the ops.

Importing this module registers the ops; `import plugins` does it.
"""

import warnings

import torch
from torch import Tensor

from plugins import checks, reference

_NS = "deepspec"
_warned = False
_LIB = torch.library.Library(_NS, "DEF")


class _CustomOp:
    """`torch.library.custom_op`'s registration surface (`register_kernel`, `register_fake`) on the plain Library
    API. custom_op wraps every kernel in `torch._disable_dynamo`, whose first call imports torch._dynamo: 2.5 s at
    the first verification in every process (each worker start, each CLI run, each test process). The ops need
    none of it: eager calls dispatch straight to the kernel, and torch.compile / torch.export trace the fake."""

    def __init__(self, fn, mutates_args: tuple[str, ...]):
        self.name = fn.__name__
        _LIB.define(self.name + torch.library.infer_schema(fn, mutates_args=mutates_args))
        _LIB.impl(self.name, fn, "CompositeExplicitAutograd")  # every device without a kernel of its own

    def register_kernel(self, device: str):
        def register(fn):
            _LIB.impl(self.name, fn, {"cuda": "CUDA", "cpu": "CPU"}[device])
            return fn

        return register

    def register_fake(self, fn):
        torch.library.register_fake(f"{_NS}::{self.name}", fn, lib=_LIB)
        return fn


def _custom_op(mutates_args: tuple[str, ...] = ()):
    return lambda fn: _CustomOp(fn, mutates_args)


def _triton():
    """The Triton launchers, or None (warned once) when triton is not installed."""
    global _warned
    try:
        from plugins.kernels import launch
    except ImportError as exc:
        if not _warned:
            warnings.warn(
                f"deepspec plugins: triton is not importable ({exc}); CUDA tensors run the torch reference "
                "ops instead (pip install 'deepspec[plugins]')",
                stacklevel=3,
            )
            _warned = True
        return None
    return launch


def _i64(B: int, like: Tensor) -> Tensor:
    return like.new_empty(B, dtype=torch.int64)


# ---- greedy_accept ---------------------------------------------------------------------------------------------
@_custom_op(mutates_args=())
def greedy_accept(draft_tokens: Tensor, num_draft_tokens: Tensor, target_logits: Tensor) -> tuple[Tensor, Tensor]:
    checks.chain("greedy_accept", draft_tokens, num_draft_tokens, target_logits)
    return reference.greedy_accept(draft_tokens, num_draft_tokens, target_logits)


@greedy_accept.register_kernel("cuda")
def _(draft_tokens, num_draft_tokens, target_logits):
    checks.chain("greedy_accept", draft_tokens, num_draft_tokens, target_logits)
    launch = _triton()
    if launch is None:
        return reference.greedy_accept(draft_tokens, num_draft_tokens, target_logits)
    return launch.greedy_accept(draft_tokens, num_draft_tokens, target_logits)


@greedy_accept.register_fake
def _(draft_tokens, num_draft_tokens, target_logits):
    checks.chain("greedy_accept", draft_tokens, num_draft_tokens, target_logits)
    B = draft_tokens.shape[0]
    return _i64(B, draft_tokens), _i64(B, draft_tokens)


# ---- rejection_sample ------------------------------------------------------------------------------------------
@_custom_op(mutates_args=())
def rejection_sample(
    draft_tokens: Tensor,
    num_draft_tokens: Tensor,
    target_logits: Tensor,
    draft_probs: Tensor | None,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    seeds: Tensor,
) -> tuple[Tensor, Tensor]:
    _check_rejection(draft_tokens, num_draft_tokens, target_logits, draft_probs, temperature, top_k, top_p, seeds)
    return reference.rejection_sample(
        draft_tokens, num_draft_tokens, target_logits, draft_probs, temperature, top_k, top_p, seeds
    )


@rejection_sample.register_kernel("cuda")
def _(draft_tokens, num_draft_tokens, target_logits, draft_probs, temperature, top_k, top_p, seeds):
    args = (draft_tokens, num_draft_tokens, target_logits, draft_probs, temperature, top_k, top_p, seeds)
    _check_rejection(*args)
    launch = _triton()
    return (launch or reference).rejection_sample(*args)


@rejection_sample.register_fake
def _(draft_tokens, num_draft_tokens, target_logits, draft_probs, temperature, top_k, top_p, seeds):
    _check_rejection(draft_tokens, num_draft_tokens, target_logits, draft_probs, temperature, top_k, top_p, seeds)
    B = draft_tokens.shape[0]
    return _i64(B, draft_tokens), _i64(B, draft_tokens)


def _check_rejection(draft_tokens, num_draft_tokens, target_logits, draft_probs, temperature, top_k, top_p, seeds):
    checks.chain("rejection_sample", draft_tokens, num_draft_tokens, target_logits, draft_probs)
    checks.sampling("rejection_sample", draft_tokens.shape[0], temperature, top_k, top_p, seeds)


# ---- process_logits --------------------------------------------------------------------------------------------
@_custom_op(mutates_args=())
def process_logits(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    _check_process(logits, temperature, top_k, top_p)
    return reference.process_logits(logits, temperature, top_k, top_p)


@process_logits.register_kernel("cuda")
def _(logits, temperature, top_k, top_p):
    _check_process(logits, temperature, top_k, top_p)
    return (_triton() or reference).process_logits(logits, temperature, top_k, top_p)


@process_logits.register_fake
def _(logits, temperature, top_k, top_p):
    _check_process(logits, temperature, top_k, top_p)
    return logits.new_empty(logits.shape, dtype=torch.float32)


def _check_process(logits, temperature, top_k, top_p):
    checks.tensor("process_logits", "logits", logits, 3)
    checks.sampling("process_logits", logits.shape[0], temperature, top_k, top_p)


# ---- tree_accept -----------------------------------------------------------------------------------------------
@_custom_op(mutates_args=())
def tree_accept(
    tree_tokens: Tensor,
    parents: Tensor,
    num_nodes: Tensor,
    target_logits: Tensor,
    draft_probs: Tensor | None,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    seeds: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    _check_tree(tree_tokens, parents, num_nodes, target_logits, draft_probs, temperature, top_k, top_p, seeds)
    return reference.tree_accept(
        tree_tokens, parents, num_nodes, target_logits, draft_probs, temperature, top_k, top_p, seeds
    )


@tree_accept.register_kernel("cuda")
def _(tree_tokens, parents, num_nodes, target_logits, draft_probs, temperature, top_k, top_p, seeds):
    args = (tree_tokens, parents, num_nodes, target_logits, draft_probs, temperature, top_k, top_p, seeds)
    _check_tree(*args)
    return (_triton() or reference).tree_accept(*args)


@tree_accept.register_fake
def _(tree_tokens, parents, num_nodes, target_logits, draft_probs, temperature, top_k, top_p, seeds):
    _check_tree(tree_tokens, parents, num_nodes, target_logits, draft_probs, temperature, top_k, top_p, seeds)
    B = tree_tokens.shape[0]
    return _i64(B, tree_tokens), _i64(B, tree_tokens), tree_tokens.new_empty(tree_tokens.shape)


def _check_tree(tree_tokens, parents, num_nodes, target_logits, draft_probs, temperature, top_k, top_p, seeds):
    checks.tree("tree_accept", tree_tokens, parents, num_nodes, target_logits, draft_probs)
    checks.sampling("tree_accept", tree_tokens.shape[0], temperature, top_k, top_p, seeds)


# ---- compact_kv ------------------------------------------------------------------------------------------------
@_custom_op(mutates_args=("cache",))
def compact_kv(cache: Tensor, start: Tensor, path: Tensor, num_accepted: Tensor) -> None:
    _check_compact(cache, start, path, num_accepted)
    reference.compact_kv(cache, start, path, num_accepted)


@compact_kv.register_kernel("cuda")
def _(cache, start, path, num_accepted):
    _check_compact(cache, start, path, num_accepted)
    (_triton() or reference).compact_kv(cache, start, path, num_accepted)


@compact_kv.register_fake
def _(cache, start, path, num_accepted):
    _check_compact(cache, start, path, num_accepted)


def _check_compact(cache, start, path, num_accepted):
    op = "compact_kv"
    checks.tensor(op, "cache", cache, 5, (torch.float32, torch.float16, torch.bfloat16))
    checks.tensor(op, "start", start, 1, checks.INT)
    checks.tensor(op, "path", path, 2, checks.INT)
    checks.tensor(op, "num_accepted", num_accepted, 1, checks.INT)
    checks.same(
        op,
        "batch sizes of cache (dim 1), start, path and num_accepted",
        cache.shape[1],
        start.shape[0],
        path.shape[0],
        num_accepted.shape[0],
    )
    N, S = path.shape[1], cache.shape[3]
    checks.counts(op, "num_accepted", num_accepted, 0, N - 1)
    checks.counts(op, "start", start, 0, S - N)


# ---- confidence_truncate ---------------------------------------------------------------------------------------
@_custom_op(mutates_args=())
def confidence_truncate(confidence: Tensor, num_draft_tokens: Tensor, threshold: float) -> tuple[Tensor, Tensor]:
    _check_truncate(confidence, num_draft_tokens)
    return reference.confidence_truncate(confidence, num_draft_tokens, threshold)


@confidence_truncate.register_kernel("cuda")
def _(confidence, num_draft_tokens, threshold):
    _check_truncate(confidence, num_draft_tokens)
    return (_triton() or reference).confidence_truncate(confidence, num_draft_tokens, threshold)


@confidence_truncate.register_fake
def _(confidence, num_draft_tokens, threshold):
    _check_truncate(confidence, num_draft_tokens)
    return _i64(confidence.shape[0], num_draft_tokens), confidence.new_empty(confidence.shape, dtype=torch.float32)


def _check_truncate(confidence, num_draft_tokens):
    op = "confidence_truncate"
    checks.tensor(op, "confidence", confidence, 2)
    checks.tensor(op, "num_draft_tokens", num_draft_tokens, 1, checks.INT)
    checks.same(op, "batch sizes of confidence and num_draft_tokens", confidence.shape[0], num_draft_tokens.shape[0])
    checks.counts(op, "num_draft_tokens", num_draft_tokens, 0, confidence.shape[1])
