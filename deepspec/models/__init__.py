"""Targets (HF dir, GGUF, alias or ONNX export) and draft architectures: the model layer, which imports nothing from
`deepspec.decoding` (the engine and its drafter registry sit above it).

`Target` is the protocol every backend implements (deepspec/models/target.py); `load_target` returns the PyTorch
`DecoderTarget`, or the `OnnxTarget` of an ONNX export directory; `deepspec.models.native.load_native_target` the
native CPU decoder (4-bit blocks or int8); `pytorch_decoder` hands an exporter the decoder module behind a
`DecoderTarget`.

The names below load lazily, so the torch-free parts (aliases, quantization) can be imported by a command line
(`training`'s `--quantization` choices) without pulling torch in at parse time.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what the lazy names are, for type checkers and editors
    from deepspec.models.aliases import ALIASES, DEFAULT_TARGET
    from deepspec.models.decoder_target import DecoderTarget, pytorch_decoder
    from deepspec.models.quantization import QUANTIZATIONS
    from deepspec.models.target import SlotCache, Target, TargetEmbeddings
    from deepspec.models.target_loader import load_target, parse_dtype

_LAZY = {
    "ALIASES": "deepspec.models.aliases",
    "DEFAULT_TARGET": "deepspec.models.aliases",
    "QUANTIZATIONS": "deepspec.models.quantization",
    "DecoderTarget": "deepspec.models.decoder_target",
    "SlotCache": "deepspec.models.target",
    "Target": "deepspec.models.target",
    "TargetEmbeddings": "deepspec.models.target",
    "load_target": "deepspec.models.target_loader",
    "pytorch_decoder": "deepspec.models.decoder_target",
    "parse_dtype": "deepspec.models.target_loader",
}

__all__ = [
    "ALIASES",
    "DEFAULT_TARGET",
    "QUANTIZATIONS",
    "DecoderTarget",
    "SlotCache",
    "Target",
    "TargetEmbeddings",
    "load_target",
    "pytorch_decoder",
    "parse_dtype",
]
assert set(__all__) == set(_LAZY)  # one entry in each per lazy name


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'deepspec.models' has no attribute '{name}'")
    return getattr(importlib.import_module(_LAZY[name]), name)
