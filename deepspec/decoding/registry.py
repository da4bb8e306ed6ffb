"""Drafters by name: the one place that turns a CLI string or a draft directory into a Drafter.

Two tables, both filled explicitly below (no module registers itself on import):

- named drafters, `register_drafter(name, factory)`: `prompt-lookup`, `random` (tests); factory(target, **options);
- draft directories by the `algo` of their config.json, `register_checkpoint_algo(algo, loader)`: `corpus-lookup`
  (an index) and `hybrid` (a corpus and a neural draft directory, drafters/hybrid.py);
  loader(path, header, target, **options).

A directory whose `algo` is a draft algorithm (deepspec.algorithms: `eagle3`, `dflash`, `dspark` and any registered
later) loads through that algorithm's own drafter class: its trained weights read by deepspec.models.drafts, and on
the ONNX export written with that draft run through its graphs (drafters/onnx_graphs.py).

`build_drafter(spec, target)` also knows `none` (target-only: no drafter) and `auto`: the shipped draft (drafts/) for
this target with the highest measured greedy acceptance length, when that reaches AUTO_MIN_ACCEPTANCE_LENGTH; below
it a trained draft costs more than it wins against prompt lookup, which needs no training, so `auto` falls back to
prompt lookup. `drafter_keywords()` is every spec that names no directory, the one list the stages check a `--draft`
value against. The model layer (deepspec.models) only reads and writes draft architectures; it never imports this.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from deepspec.algorithms import available_algorithms, load_part, resolve_algorithm
from deepspec.decoding.drafter import Drafter
from deepspec.decoding.drafters import neural, onnx_graphs
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


def drafter_keywords() -> tuple[str, ...]:
    """Every spec `build_drafter` accepts that names no draft directory: `none`, `auto` and the named drafters."""
    return (*_KEYWORDS, *sorted(_DRAFTERS))


def checkpoint_algos() -> list[str]:
    """Every config.json `algo` a draft directory may have: the registered draft algorithms and the other kinds."""
    return sorted({*_CHECKPOINT_ALGOS, *available_algorithms()})


def available_drafters() -> list[str]:
    """Every spec `build_drafter` accepts, as shown in CLI help and errors."""
    return [*drafter_keywords(), f"<draft dir: {'|'.join(checkpoint_algos())}>"]


def resolve_drafter(name: str) -> DrafterFactory:
    try:
        return _DRAFTERS[name]
    except KeyError:
        raise KeyError(f"unknown drafter '{name}'; available: {available_drafters()}") from None


def resolve_checkpoint_algo(algo: str) -> CheckpointLoader:
    if algo in _CHECKPOINT_ALGOS:
        return _CHECKPOINT_ALGOS[algo]
    try:
        algorithm = resolve_algorithm(algo)
    except KeyError:
        raise KeyError(f"unknown draft algorithm '{algo}'; this engine loads {checkpoint_algos()}") from None
    return _algorithm_loader(load_part(algorithm.drafter))


def _algorithm_loader(cls: type[neural.NeuralDrafter]) -> CheckpointLoader:
    """A draft algorithm's directories → its drafter class around the trained weights; on the ONNX export written
    with that very draft, around its graphs."""
    return onnx_graphs.checkpoint_loader(cls, neural.checkpoint_loader(cls))


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
        return (
            load_checkpoint_drafter(path, target, **options)
            if path
            else build_drafter("prompt-lookup", target, **options)
        )
    if spec in _DRAFTERS:
        return _DRAFTERS[spec](target, **options)
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return load_checkpoint_drafter(path, target, **options)
    raise ValueError(f"unknown drafter '{spec}'; available: {', '.join(available_drafters())}")


def _register_builtins() -> None:
    from deepspec.decoding.drafters import corpus_lookup, hybrid
    from deepspec.decoding.drafters.prompt_lookup import PromptLookupDrafter
    from deepspec.decoding.drafters.random import RandomDrafter

    register_drafter("prompt-lookup", lambda target, **kw: PromptLookupDrafter(**kw))
    register_drafter("random", lambda target, **kw: RandomDrafter(target.vocab_size, **kw))
    register_checkpoint_algo(corpus_lookup.ALGO, corpus_lookup.load_drafter)
    register_checkpoint_algo(hybrid.ALGO, functools.partial(hybrid.load_drafter, load_part=load_checkpoint_drafter))


_register_builtins()
