"""What an export reads: the target (its Hugging Face files, never the serving engine) and the draft directory.

`TargetSource` resolves an alias, GGUF file or HF directory exactly as the worker does (an alias's GGUF is
dequantized once into the cache), reads config.json into the same ArchSpec and computes the same fingerprint, but
loads tensors one at a time on demand: converting a checkpoint never holds the fast decoder, its packed weights and
a converted copy at once. `DraftSource` reads a draft checkpoint (config, weights, vocabulary map) and checks that
it was trained for this target.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from deepspec.models.hf_text import HFTextTarget
from export.errors import ExportError

if TYPE_CHECKING:
    from deepspec.models.arch import ArchSpec
    from deepspec.models.drafts.config import DraftConfig


@dataclass
class TargetSource:
    #: the --target value as given (alias or path); what manifests name
    spec: str
    #: display name (alias, file stem or directory name)
    name: str
    #: Hugging Face directory: config.json, *.safetensors, tokenizer
    path: Path
    arch: ArchSpec
    config: dict
    _index: dict[str, Path] = field(default_factory=dict, repr=False)

    @cached_property
    def tokenizer(self):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.path)

    @property
    def is_alias(self) -> bool:
        from deepspec.models.aliases import ALIASES

        return self.spec in ALIASES

    @property
    def family(self) -> str:
        return self.arch.family

    def fingerprint(self) -> dict:
        """The same dict `Target.fingerprint` gives for this target once loaded (drafts store and compare it)."""
        return _FingerprintView(self.path, self.arch, self).fingerprint()

    # ---- tensors, one at a time ---------------------------------------------------------------------------------
    def tensor_names(self) -> list[str]:
        if not self._index:
            from safetensors import safe_open

            files = sorted(self.path.glob("*.safetensors"))
            if not files:
                raise ExportError(f"target {self.spec}: {self.path} holds no *.safetensors weights")
            for f in files:
                with safe_open(f, "pt") as st:
                    for key in st.keys():  # noqa: SIM118 (safe_open has keys(), not __iter__)
                        self._index[key] = f
        return sorted(self._index)

    def tensor(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        self.tensor_names()
        if name not in self._index:
            raise ExportError(f"target {self.spec}: tensor {name!r} is missing from {self.path}")
        with safe_open(self._index[name], "pt") as st:
            return st.get_tensor(name)

    def head_weight(self) -> torch.Tensor:
        """The output head [V, H]: lm_head.weight, or the embedding when the two are tied."""
        names = set(self.tensor_names())
        if "lm_head.weight" in names:
            return self.tensor("lm_head.weight")
        return self.tensor("model.embed_tokens.weight")


@dataclass
class _FingerprintView(HFTextTarget):
    """What `HFTextTarget.fingerprint` reads of a target (directory, ArchSpec, tokenizer), without loading one."""

    path: Path
    spec: ArchSpec
    source: TargetSource

    @property
    def tokenizer(self):
        return self.source.tokenizer


def open_target(spec: str) -> TargetSource:
    """Alias | *.gguf | HF directory -> TargetSource; ExportError naming the problem otherwise."""
    from transformers import AutoConfig

    from deepspec.models.arch import arch_spec_from_config
    from deepspec.models.target_loader import resolve_target_dir

    try:
        name, path, _ = resolve_target_dir(spec)
        config = AutoConfig.from_pretrained(path)
        arch = arch_spec_from_config(config)
    except (FileNotFoundError, ValueError, OSError) as e:
        raise ExportError(f"target {spec}: {e}") from None
    raw = json.loads((path / "config.json").read_text())
    return TargetSource(spec=spec, name=name, path=Path(path).resolve(), arch=arch, config=raw)


@dataclass
class DraftSource:
    path: Path
    #: config.json as written by training (algo, sizes, feature_layers, target fingerprint)
    header: dict
    #: the DraftConfig of a draft algorithm's directory (neural), None for a corpus-lookup index or a hybrid
    cfg: DraftConfig | None
    #: a hybrid's parts ("corpus", "neural"), each opened and checked like a draft of its own
    parts: dict[str, DraftSource] = field(default_factory=dict)

    @property
    def algo(self) -> str:
        return self.header["algo"]

    @property
    def is_neural(self) -> bool:
        return self.cfg is not None

    @property
    def kind(self) -> str:
        """What the draft is, for messages: 'a corpus-lookup index', 'a hybrid (...)', 'an eagle3 draft'."""
        if self.algo == HYBRID:
            return f"a hybrid ({self.parts['corpus'].algo} + {self.parts['neural'].kind})"
        if not self.is_neural:
            return f"a {self.algo} index"
        return f"an {self.algo} draft" if self.algo[0] in "aeiou" else f"a {self.algo} draft"

    def weights(self) -> dict[str, torch.Tensor]:
        """model.safetensors in float32 (bf16 and int8 storage are upcast: every format casts to its own dtype)."""
        from deepspec.models.drafts import DraftCheckpointError, read_draft_weights

        try:
            state = read_draft_weights(self.path)
        except DraftCheckpointError as e:
            raise ExportError(f"draft {self.path}: cannot read model.safetensors ({e})") from None
        return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}

    def d2t(self) -> torch.Tensor:
        """[draft_vocab] target id of each draft token (the identity without a reduced vocabulary)."""
        if self.cfg is None:
            raise ExportError(f"draft {self.path}: {self.kind} has no vocabulary of its own (only neural drafts do)")
        if not self.cfg.draft_vocab_size:
            return torch.arange(self.cfg.vocab_size)
        from safetensors.torch import load_file

        return load_file(self.path / "vocab_map.safetensors")["d2t"].long()

    def files(self) -> list[Path]:
        return sorted(p for p in self.path.iterdir() if p.is_file())


#: `algo` of a hybrid draft directory (deepspec/decoding/drafters/hybrid.py): a config.json naming a corpus-lookup
#: and a neural draft directory, relative to itself
HYBRID = "hybrid"
#: `algo` of a corpus-lookup index
CORPUS_LOOKUP = "corpus-lookup"


def open_draft(path: str | Path, target: TargetSource) -> DraftSource:
    """Read and check a draft directory against the target; ExportError for a missing file, a broken config or a
    draft trained for another target."""
    from deepspec.algorithms import available_algorithms
    from deepspec.models.drafts import (
        DraftCheckpointError,
        DraftTargetMismatchError,
        check_target,
        read_checkpoint_header,
        read_draft_config,
    )

    path = Path(path)
    if not path.is_dir():
        raise ExportError(
            f"draft {path}: no such directory (a draft from python -m training, or none, prompt-lookup, auto)"
        )
    try:
        header = read_checkpoint_header(path)
        check_target(header.get("target", {}), target, where=f"draft {path}")
        if header["algo"] == CORPUS_LOOKUP:
            if not (path / "corpus.safetensors").is_file():
                raise ExportError(f"draft {path}: corpus.safetensors is missing")
            return DraftSource(path, header, None)
        if header["algo"] == HYBRID:
            return DraftSource(path, header, None, _hybrid_parts(path, header, target))
        if header["algo"] not in available_algorithms():
            raise ExportError(
                f"draft {path}: algo {header['algo']!r} is not one this DeepSpec exports (one of "
                f"{', '.join((*available_algorithms(), CORPUS_LOOKUP, HYBRID))})"
            )
        cfg = read_draft_config(path)
    except (DraftCheckpointError, DraftTargetMismatchError) as e:
        raise ExportError(str(e)) from None
    if not (path / "model.safetensors").is_file():
        raise ExportError(f"draft {path}: model.safetensors is missing (an interrupted copy? re-export the draft)")
    if cfg.draft_vocab_size and not (path / "vocab_map.safetensors").is_file():
        raise ExportError(
            f"draft {path}: config says draft_vocab_size={cfg.draft_vocab_size} but vocab_map.safetensors is missing"
        )
    return DraftSource(path, header, cfg)


def _hybrid_parts(path: Path, header: dict, target: TargetSource) -> dict[str, DraftSource]:
    """A hybrid's two parts, opened relative to its directory (as deepspec/decoding/drafters/hybrid.py loads them)."""
    parts = {}
    for part, want_neural in (("corpus", False), ("neural", True)):
        where = header.get(part)
        if not isinstance(where, str):
            raise ExportError(f"draft {path}: a hybrid's config.json names its {part!r} draft directory")
        source = open_draft((path / where).resolve(), target)
        if source.is_neural != want_neural or source.algo == HYBRID:
            raise ExportError(f"draft {path}: its {part} part {where} is {source.kind}")
        parts[part] = source
    return parts
