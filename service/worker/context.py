"""The context a worker serves: what the target declares, unless the KV cache for every batch slot would not fit.

vLLM's rule for `max_model_len`, on the memory this worker has: the default is the model's own context (its
config's `max_position_embeddings`, a GGUF's `context_length`: 8,192 for the default SmolLM2); an explicit
`--max-seq-len` above it is refused, and so is one whose cache does not fit (vLLM raises "the model's max seq len
is larger than the maximum number of tokens that can be stored in KV cache"). Where no length was asked for and the
declared one does not fit, the context is lowered to what fits and the log says why (vLLM v1 does the same for
`--max-model-len auto`, vllm/v1/core/kv_cache_utils.py `_auto_fit_max_model_len`).

The engine preallocates one cache of `max_batch_size` slots × (context + draft slack) positions
(deepspec/decoding/engine.py), so that product, times the bytes one position takes in the target's own cache
layout, is what must fit. It must fit in a share (`kv_cache_memory_fraction`) of the memory available once the
weights are loaded: the host's MemAvailable, bounded by the container's cgroup limit (a pod's `resources.limits`),
or the GPU's free memory on CUDA.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

#: a lowered context is a multiple of this many tokens (a page of the cache, as vLLM's block sizes round it)
CONTEXT_GRANULE = 256
#: below this many tokens a context is useless for chat: refuse to start instead of serving it
MIN_CONTEXT = 256

_GIB = 1024**3


@dataclass(frozen=True)
class ServedContext:
    """The context a worker serves, and why it is that long (logged at start)."""

    tokens: int
    reason: str


def kv_bytes_per_position(target) -> int:
    """Bytes one position of one slot takes in the target's own cache (the backends differ: float16 for the native
    decoder, the attention dtype for PyTorch, float32 for ONNX Runtime), measured on a one-position cache."""
    cache = target.new_cache(1, 1)
    buffers = [v for v in vars(cache).values() if isinstance(v, torch.Tensor) or hasattr(v, "nbytes")]
    return max(1, sum(int(b.nbytes) for b in buffers))


def available_memory_bytes(device: str = "cpu") -> int | None:
    """Memory this process may still take: the GPU's free memory on CUDA; on CPU the host's MemAvailable bounded
    by the cgroup v2 limit (memory.max - memory.current). None where neither can be read."""
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info()
        return int(free)
    candidates = [b for b in (_meminfo_available(), _cgroup_headroom()) if b is not None]
    return min(candidates) if candidates else None


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def _cgroup_headroom(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    try:
        limit = (root / "memory.max").read_text().strip()
        used = int((root / "memory.current").read_text().strip())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else max(0, int(limit) - used)


def served_context(
    declared: int,
    requested: int | None,
    *,
    slots: int,
    slack: int,
    bytes_per_position: int,
    available_bytes: int | None,
    memory_fraction: float,
) -> ServedContext:
    """The context to serve. `declared`: the target's own limit; `requested`: --max-seq-len (None = not given);
    `slots` sequences of context + `slack` positions each must fit in `memory_fraction` of `available_bytes`
    (None = unknown: not limited). ValueError, naming the fix, for a request the target or the memory cannot hold."""
    if requested is not None and requested > declared:
        raise ValueError(
            f"--max-seq-len {requested} exceeds the {declared} tokens the target declares; use at most {declared}"
        )
    wanted = requested or declared
    if available_bytes is None:
        return ServedContext(wanted, f"{_origin(requested)}; the memory available could not be read")
    budget = int(available_bytes * memory_fraction)
    per_token = slots * bytes_per_position
    fits = budget // per_token - slack
    need = per_token * (wanted + slack)
    sizes = (
        f"the KV cache of {slots} sequences × {wanted + slack} positions needs {need / _GIB:.2f} GiB, "
        f"{memory_fraction:.0%} of the {available_bytes / _GIB:.1f} GiB available is {budget / _GIB:.2f} GiB"
    )
    if fits >= wanted:
        return ServedContext(wanted, f"{_origin(requested)}; {sizes}")
    fix = "lower --max-batch-size or raise --kv-cache-memory-fraction (DEEPSPEC_WORKER_KV_CACHE_MEMORY_FRACTION)"
    if requested is not None:
        raise ValueError(
            f"--max-seq-len {requested} does not fit in memory: {sizes}; at most {max(fits, 0)} tokens "
            f"fit: {fix}, or ask for less"
        )
    lowered = fits // CONTEXT_GRANULE * CONTEXT_GRANULE
    if lowered < MIN_CONTEXT:
        raise ValueError(f"not even {MIN_CONTEXT} tokens of context fit in memory: {sizes}; {fix}")
    return ServedContext(
        lowered, f"lowered from the {declared} tokens the target declares: {sizes}; {fix} to serve more"
    )


def _origin(requested: int | None) -> str:
    return "--max-seq-len" if requested is not None else "the context the target declares"


def decide_context(target, settings, num_speculative_tokens: int) -> ServedContext:
    """`served_context` for a loaded target and the worker's settings; logs the decision."""
    context = served_context(
        target.max_seq_len,
        settings.max_seq_len,
        slots=settings.max_batch_size,
        slack=num_speculative_tokens + 2,
        bytes_per_position=kv_bytes_per_position(target),
        available_bytes=available_memory_bytes(settings.device),
        memory_fraction=settings.kv_cache_memory_fraction,
    )
    log = logger.warning if context.reason.startswith("lowered") else logger.info
    log("context %d tokens: %s", context.tokens, context.reason)
    return context
