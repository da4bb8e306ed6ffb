"""Draft specs with drafting options, so one report can put a draft's tree next to its chain.

`eval --draft` and `bench.decode --drafters` name drafts by directory or registered name; a spec may add keyword
options for `build_drafter` after a colon: `drafts/smollm2-135m-corpus:tree=false`,
`drafts/smollm2-135m-eagle3:tree_branches=4,tree_width=4`. Values are JSON (true, 4, 0.5) or else strings. The
row label is the draft's name with its options in brackets, e.g. `smollm2-135m-corpus[tree=false]`.

`tree_variants` knows, per draft directory kind, which options make the chain and which the tree (a draft
algorithm's record says it, `tree_options`; the corpus-lookup index's are below), so a benchmark can add both rows
for the default draft without the caller knowing how each drafter spells it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from deepspec.algorithms import available_algorithms, resolve_algorithm

#: the corpus-lookup index's build_drafter options of its chain and of its tree
CORPUS_TREE_OPTIONS = ({"tree": False}, {"tree": True})


@dataclass(frozen=True)
class DraftSpec:
    #: the directory or registered name build_drafter takes
    base: str
    options: dict = field(default_factory=dict)

    def build(self, target):
        """The drafter this spec names, for `target` (deepspec.decoding.registry.build_drafter with its options)."""
        from deepspec.decoding.registry import build_drafter

        return build_drafter(self.base, target, **self.options)

    @property
    def label(self) -> str:
        name = Path(self.base).name if Path(self.base).is_dir() else self.base
        if not self.options:
            return name
        return f"{name}[{','.join(f'{k}={json.dumps(v)}' for k, v in self.options.items())}]"

    def __hash__(self) -> int:
        return hash((self.base, json.dumps(self.options, sort_keys=True)))


def parse_draft_spec(spec: str) -> DraftSpec:
    """'DIR_OR_NAME[:key=value,...]' → DraftSpec; a malformed option raises ValueError naming it."""
    base, sep, rest = spec.partition(":")
    if not base:
        raise ValueError(f"draft spec '{spec}' names no draft")
    options: dict = {}
    if sep:
        for item in filter(None, (s.strip() for s in rest.split(","))):
            key, eq, value = item.partition("=")
            if not eq or not key.isidentifier():
                raise ValueError(f"draft option '{item}' in '{spec}' is not key=value (e.g. {base}:tree=true)")
            try:
                options[key] = json.loads(value)
            except json.JSONDecodeError:
                options[key] = value
    return DraftSpec(base, options)


def draft_algo(base: str) -> str | None:
    """The `algo` of a draft directory's config.json; None for a registered name or an unreadable directory."""
    config = Path(base) / "config.json"
    try:
        return json.loads(config.read_text()).get("algo")
    except (OSError, ValueError):
        return None


def tree_variants(base: str) -> list[DraftSpec]:
    """The chain and the tree of one draft directory (both, whatever its config's default); [] for an algorithm
    that drafts no trees."""
    options = _tree_options(draft_algo(base) or "")
    return [DraftSpec(base, dict(o)) for o in options] if options else []


def _tree_options(algo: str) -> tuple[dict, dict] | None:
    if algo == "corpus-lookup":
        return CORPUS_TREE_OPTIONS
    return resolve_algorithm(algo).tree_options if algo in available_algorithms() else None


def is_tree_drafter(drafter) -> bool:
    """Whether a built drafter proposes trees (corpus: `tree` True; neural: a TreeShape in `tree`)."""
    return bool(getattr(drafter, "tree", None))
