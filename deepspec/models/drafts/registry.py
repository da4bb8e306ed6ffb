"""Draft architectures by algorithm name: `register_draft`, `resolve_draft`, `available_drafts`."""

from __future__ import annotations

from deepspec.models.drafts.config import DraftConfig

_DRAFTS: dict[str, type] = {}


def register_draft(name: str, cls: type) -> None:
    _DRAFTS[name] = cls


def available_drafts() -> list[str]:
    return sorted(_DRAFTS)


def resolve_draft(name: str) -> type:
    try:
        return _DRAFTS[name]
    except KeyError:
        raise KeyError(f"unknown draft algorithm '{name}'; available: {available_drafts()}") from None


def build_draft(cfg: DraftConfig):
    """A fresh (randomly initialised) draft of cfg.algo; call .attach(target) before use."""
    return resolve_draft(cfg.algo)(cfg)


def _register_builtins() -> None:
    from deepspec.models.drafts.dflash import DFlashDraft
    from deepspec.models.drafts.dspark import DSparkDraft
    from deepspec.models.drafts.eagle3 import Eagle3Draft

    register_draft("eagle3", Eagle3Draft)
    register_draft("dflash", DFlashDraft)
    register_draft("dspark", DSparkDraft)


_register_builtins()
