"""CPU implementations of every op: vectorized torch, no loop over rows, no per-token host sync.

They are the reference the Triton kernels are tested against (`python -m plugins check`, the interpreter tests)
and what `torch.ops.deepspec.*` runs on CPU, so they are written for speed as well as clarity.
"""

from plugins.reference.accept import confidence_truncate, greedy_accept, rejection_sample
from plugins.reference.logits import process_logits
from plugins.reference.tree import compact_kv, tree_accept

__all__ = ["compact_kv", "confidence_truncate", "greedy_accept", "process_logits", "rejection_sample", "tree_accept"]
