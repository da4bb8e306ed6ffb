"""Drafters by name: the one place that turns a CLI string or a draft directory into a Drafter.

Two tables, both filled explicitly below (no module registers itself on import):

- named drafters, `register_drafter(name, factory)`: `prompt-lookup`, `random` (tests); factory(target, **options);
- draft directories by the `algo` of their config.json, `register_checkpoint_algo(algo, loader)`: `eagle3`,
  `dflash`, `dspark` (trained weights, read by deepspec.models.drafts; on the ONNX export written with that draft,
  run through its graphs, drafters/onnx_graphs.py), `corpus-lookup` (an index) and `hybrid` (a corpus and a neural
  draft directory, drafters/hybrid.py);
  loader(path, header, target, **options).

`build_drafter(spec, target)` also knows `none` (target-only: no drafter) and `auto`: the shipped draft (drafts/) for
this target with the highest measured greedy acceptance length, when that reaches AUTO_MIN_ACCEPTANCE_LENGTH; below
it a trained draft costs more than it wins against prompt lookup, which needs no training, so `auto` falls back to
prompt lookup. The model layer (deepspec.models) only reads and writes draft architectures; it never imports this.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable

from deepspec.decoding.drafter import Drafter
from deepspec.models.target import Target

#: factory(target, **options) -> Drafter
DrafterFactory = Callable[..., Drafter]
#: loader(path, header, target, **options) -> Drafter, where header is the directory's config.json
CheckpointLoader = Callable[..., Drafter]

#: mean greedy tau (eval.json) a shipped draft needs before `auto` prefers it to prompt lookup
AUTO_MIN_ACCEPTANCE_LENGTH = 2.0

_DRAFTERS: dict[str, DrafterFactory] = {}
_CHECKPOINT_ALGOS: dict[str, CheckpointLoader] = {}
_KEYWORDS = ("none", "auto")


def register_drafter(name: str, factory: DrafterFactory) -> None:
    if name in _KEYWORDS:
        raise ValueError(f"'{name}' is a reserved drafter name")
    _DRAFTERS[name] = factory


def register_checkpoint_algo(algo: str, loader: CheckpointLoader) -> None:
    _CHECKPOINT_ALGOS[algo] = loader


def available_drafters() -> list[str]:
    """Every spec `build_drafter` accepts, as shown in CLI help and errors."""
    return [*_KEYWORDS, *sorted(_DRAFTERS), f"<draft dir: {'|'.join(sorted(_CHECKPOINT_ALGOS))}>"]


def resolve_drafter(name: str) -> DrafterFactory:
    try:
        return _DRAFTERS[name]
    except KeyError:
        raise KeyError(f"unknown drafter '{name}'; available: {available_drafters()}") from None


def resolve_checkpoint_algo(algo: str) -> CheckpointLoader:
    try:
        return _CHECKPOINT_ALGOS[algo]
    except KeyError:
        raise KeyError(f"unknown draft algorithm '{algo}'; this engine loads {sorted(_CHECKPOINT_ALGOS)}") from None


def load_checkpoint_drafter(path: str | Path, target: Target, **options) -> Drafter:
    """A draft directory (config.json with `algo`) → the Drafter of its algorithm, checked against `target`."""
    from deepspec.models.drafts import DraftCheckpointError, read_checkpoint_header

    header = read_checkpoint_header(path)
    try:
        loader = resolve_checkpoint_algo(header["algo"])
    except KeyError as exc:
        raise DraftCheckpointError(f"{path}: {exc.args[0]}") from None
    return loader(Path(path), header, target, **options)


def best_shipped_draft(target: Target) -> Path | None:
    """The shipped draft `auto` should use for this target, or None (then prompt lookup)."""
    from deepspec.models.drafts import best_shipped_draft as best

    return best(target, min_acceptance_length=AUTO_MIN_ACCEPTANCE_LENGTH)


def build_drafter(spec: str | None, target: Target, **options) -> Drafter | None:
    """`none` → None; `auto`, a registered name or a draft directory → a Drafter ready for the engine."""
    if spec in (None, "", "none"):
        return None
    if spec == "auto":
        path = best_shipped_draft(target)
        return load_checkpoint_drafter(path, target, **options) if path else build_drafter("prompt-lookup", target,
                                                                                           **options)
    if spec in _DRAFTERS:
        return _DRAFTERS[spec](target, **options)
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return load_checkpoint_drafter(path, target, **options)
    raise ValueError(f"unknown drafter '{spec}'; available: {', '.join(available_drafters())}")


def _register_builtins() -> None:
    from deepspec.decoding.drafters import corpus_lookup, hybrid, neural, onnx_graphs
    from deepspec.decoding.drafters.dflash import DFlashDrafter
    from deepspec.decoding.drafters.dspark import DSparkDrafter
    from deepspec.decoding.drafters.eagle3 import Eagle3Drafter
    from deepspec.decoding.drafters.prompt_lookup import PromptLookupDrafter
    from deepspec.decoding.drafters.random import RandomDrafter

    register_drafter("prompt-lookup", lambda target, **kw: PromptLookupDrafter(**kw))
    register_drafter("random", lambda target, **kw: RandomDrafter(target.vocab_size, **kw))
    for cls in (Eagle3Drafter, DFlashDrafter, DSparkDrafter):  # on an ONNX export with its graphs, through them
        register_checkpoint_algo(cls.name, onnx_graphs.checkpoint_loader(cls, neural.checkpoint_loader(cls)))
    register_checkpoint_algo(corpus_lookup.ALGO, corpus_lookup.load_drafter)
    register_checkpoint_algo(hybrid.ALGO, functools.partial(hybrid.load_drafter, load_part=load_checkpoint_drafter))


_register_builtins()
