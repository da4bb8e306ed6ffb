"""The native CPU decoder: a target's forward as one call into C compiled for this machine (decoder.c), on a GGUF
target's own 4-bit blocks or int8 weights, with verify passes that cost about what one-token steps cost.

`load_native_target(spec)` loads an alias, GGUF or Hugging Face directory onto it; build.py compiles the library on
first use (`NativeUnavailable` when there is no C compiler).
"""

from deepspec.models.native.build import NativeUnavailable
from deepspec.models.native.target import NativeTarget, load_native_target, native_target_from

__all__ = ["NativeTarget", "NativeUnavailable", "load_native_target", "native_target_from"]
