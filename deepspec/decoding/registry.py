"""Drafters by name: the one place that turns a CLI string into a Drafter.

Built-in names: `none` (target-only), `prompt-lookup`, `random` (tests), `auto`, or a path to a draft
checkpoint directory. `auto` takes the shipped draft (drafts/) for this target with the highest measured greedy
acceptance length, when that reaches AUTO_MIN_ACCEPTANCE_LENGTH; below it a trained draft costs more than it wins
against prompt lookup, which needs no training, so `auto` falls back to prompt lookup.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from deepspec.decoding.drafter import Drafter

#: name → factory(target) for drafters that need no checkpoint
_BUILTIN: dict[str, Callable] = {}
#: loaders for checkpoint directories (registered by deepspec.models.drafts when present)
_CHECKPOINT_LOADERS: list[Callable] = []


def register_drafter(name: str, factory: Callable) -> None:
    _BUILTIN[name] = factory


def register_checkpoint_loader(loader: Callable) -> None:
    """loader(path, target) -> Drafter for draft checkpoint directories (config.json + model.safetensors)."""
    _CHECKPOINT_LOADERS.append(loader)


def available_drafters() -> list[str]:
    return ["none", "auto", *sorted(_BUILTIN), "<draft checkpoint dir>"]


def _load_checkpoint_drafter(path: Path, target) -> Drafter:
    _import_draft_models()
    if not _CHECKPOINT_LOADERS:
        raise ValueError(f"'{path}' looks like a draft checkpoint, but no draft architectures are installed")
    return _CHECKPOINT_LOADERS[0](path, target)


def _import_draft_models() -> None:
    try:
        import deepspec.models.drafts  # noqa: F401  (registers its checkpoint loader)
    except ImportError:
        pass


#: mean greedy tau (eval.json) a shipped draft needs before `auto` prefers it to prompt lookup
AUTO_MIN_ACCEPTANCE_LENGTH = 2.0


def best_shipped_draft(target) -> Path | None:
    """The shipped draft `auto` should use for this target, or None (then prompt lookup)."""
    _import_draft_models()
    try:
        from deepspec.models.drafts import best_shipped_draft as best
    except ImportError:
        return None
    return best(target, min_acceptance_length=AUTO_MIN_ACCEPTANCE_LENGTH)


def build_drafter(spec: str | None, target, **options) -> Drafter | None:
    """`none` → None; a built-in name or a checkpoint directory → a Drafter ready for the engine."""
    if spec in (None, "", "none"):
        return None
    if spec == "auto":
        path = best_shipped_draft(target)
        return _load_checkpoint_drafter(path, target) if path else _BUILTIN["prompt-lookup"](target, **options)
    if spec in _BUILTIN:
        return _BUILTIN[spec](target, **options)
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return _load_checkpoint_drafter(path, target)
    raise ValueError(f"unknown drafter '{spec}'; available: {', '.join(available_drafters())}")


def _register_builtins() -> None:
    from deepspec.decoding.drafters.prompt_lookup import PromptLookupDrafter
    from deepspec.decoding.drafters.random import RandomDrafter

    register_drafter("prompt-lookup", lambda target, **kw: PromptLookupDrafter(**kw))
    register_drafter("random", lambda target, **kw: RandomDrafter(target.vocab_size, **kw))


_register_builtins()
