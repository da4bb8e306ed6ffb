"""Targets (HF dir, GGUF or alias) and, with the training issue, draft architectures."""

from deepspec.models.aliases import ALIASES, DEFAULT_TARGET
from deepspec.models.target import Target
from deepspec.models.target_loader import load_target, parse_dtype

__all__ = ["ALIASES", "DEFAULT_TARGET", "Target", "load_target", "parse_dtype"]
