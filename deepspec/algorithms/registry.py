"""Draft algorithms by name: `register_algorithm`, `resolve_algorithm`, `available_algorithms`, and the check of a
config's tensor layout against them. The table is filled explicitly below with the built-ins; an algorithm from
elsewhere registers the same way, before anything looks it up."""

from __future__ import annotations

from deepspec.algorithms.algorithm import DraftAlgorithm
from deepspec.algorithms.builtin import BUILTIN_ALGORITHMS

_ALGORITHMS: dict[str, DraftAlgorithm] = {}


def register_algorithm(algorithm: DraftAlgorithm) -> None:
    if algorithm.name in _ALGORITHMS:
        raise ValueError(f"draft algorithm '{algorithm.name}' is already registered")
    _ALGORITHMS[algorithm.name] = algorithm


def available_algorithms() -> list[str]:
    return sorted(_ALGORITHMS)


def resolve_algorithm(name: str) -> DraftAlgorithm:
    try:
        return _ALGORITHMS[name]
    except KeyError:
        raise KeyError(f"unknown draft algorithm '{name}'; available: {available_algorithms()}") from None


def check_layout(algo: str, layout: str) -> None:
    """ValueError unless `layout` is one of `algo`'s tensor layouts; names the algorithm a foreign layout belongs to."""
    layouts = resolve_algorithm(algo).layouts
    if layout in layouts:
        return
    owners = [a.name for a in _ALGORITHMS.values() if layout in a.layouts]
    if owners:
        raise ValueError(
            f"{algo} drafts have no layout '{layout}' (it is the {'/'.join(owners)} layout); use one of {list(layouts)}"
        )
    raise ValueError(f"unknown {algo} layout '{layout}'; available: {list(layouts)}")


def _register_builtins() -> None:
    for algorithm in BUILTIN_ALGORITHMS:
        register_algorithm(algorithm)


_register_builtins()
