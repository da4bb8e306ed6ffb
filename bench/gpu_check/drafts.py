"""The drafters the engine part runs, each built in process for the check's target: prompt lookup, a corpus-lookup
index, a random Eagle3, DFlash and DSpark draft (chain and tree of each through training.draft_specs' options),
and a hybrid of the corpus and the DSpark draft.

The corpus indexes the target's own fp32 greedy answers to the check's prompts (prompt and answer, as one
sequence each), so its drafts are accepted almost always: the row measures the verify path at its best (long
accepted runs, tree paths, KV compaction) where the random neural drafts are rejected almost always. Neither says
anything about a trained draft's acceptance; both must leave greedy output identical to target-only decoding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from deepspec.algorithms import available_algorithms

NEURAL_ALGOS = tuple(available_algorithms())
#: the reduced draft vocabulary of a random neural draft (the training default), capped at the target's
DRAFT_VOCAB_SIZE = 8192


@dataclass(frozen=True)
class DrafterSpec:
    label: str
    #: what build_drafter takes: a registered name or a draft directory
    spec: str
    options: dict = field(default_factory=dict)


def _random_neural_draft(target, algo: str, out: Path, block_size: int) -> Path:
    import torch

    from deepspec.models.drafts import DraftConfig, build_draft, save_draft

    layers = tuple(sorted(set(target.default_feature_layers(5))))
    cfg = DraftConfig.for_target(
        target,
        algo,
        feature_layers=layers,
        block_size=block_size,
        draft_vocab_size=min(DRAFT_VOCAB_SIZE, target.vocab_size),
    )
    torch.manual_seed(0)
    return save_draft(build_draft(cfg).attach(target), out)


def _corpus(target, sequences: list[list[int]], out: Path) -> Path:
    import numpy as np

    from deepspec.decoding.drafters.corpus_lookup import save_corpus
    from deepspec.decoding.drafters.suffix_index import SEPARATOR, SuffixIndex

    tokens = [t for seq in sequences for t in [*seq, SEPARATOR]]
    index = SuffixIndex.build(np.asarray(tokens, dtype=np.int32), 12)
    return save_corpus(out, index, target.fingerprint())


def build_drafter_specs(target, reference: list[list[int]], workdir: Path, block_size: int) -> list[DrafterSpec]:
    """Write every draft directory under `workdir` → the drafters to run, in table order. `reference`: the
    target-only greedy sequences (prompt + answer) the corpus indexes."""
    from deepspec.decoding.drafters.hybrid import save_hybrid
    from training.draft_specs import tree_variants

    dirs = {"corpus": _corpus(target, reference, workdir / "corpus")}
    for algo in NEURAL_ALGOS:
        dirs[algo] = _random_neural_draft(target, algo, workdir / algo, block_size)
    specs = [DrafterSpec("prompt-lookup", "prompt-lookup")]
    for name, path in dirs.items():
        variants = tree_variants(str(path))
        if not variants:
            raise ValueError(f"training.draft_specs knows no chain and tree options for the {name} draft at {path}")
        for shape, variant in zip(("chain", "tree"), variants):
            specs.append(DrafterSpec(f"{name} {shape}", variant.base, variant.options))
    specs.append(
        DrafterSpec("hybrid corpus+dspark", str(save_hybrid(workdir / "hybrid", dirs["corpus"], dirs["dspark"])))
    )
    return specs
