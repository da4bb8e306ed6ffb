"""The drafter registry: named drafters and draft-directory algorithms, unknown names answered with the valid ones."""

from __future__ import annotations

import json
from typing import cast

import pytest

from deepspec.decoding import registry
from deepspec.decoding.drafters.prompt_lookup import PromptLookupDrafter
from deepspec.decoding.drafters.random import RandomDrafter
from deepspec.models.drafts import DraftCheckpointError
from deepspec.models.target import Target
from tests.deepspec.decoding.checked import drafter_of


class _VocabOnly:
    vocab_size = 16
    name = "t"


def _target() -> Target:
    """A target as far as building a named drafter reads one (its vocabulary size and name)."""
    return cast(Target, _VocabOnly())


def test_builtins_are_registered_explicitly():
    assert registry.available_drafters() == [
        "none",
        "auto",
        "prompt-lookup",
        "random",
        "<draft dir: corpus-lookup|dflash|dspark|eagle3|hybrid>",
    ]
    assert registry.build_drafter("none", _target()) is None
    assert isinstance(registry.build_drafter("prompt-lookup", _target(), min_ngram=1), PromptLookupDrafter)
    assert drafter_of(registry.build_drafter("random", _target()), RandomDrafter).vocab_size == 16


def test_unknown_names_list_the_valid_ones(tmp_path):
    with pytest.raises(KeyError, match=r"unknown drafter 'nope'; available: \['none', 'auto', 'prompt-lookup'"):
        registry.resolve_drafter("nope")
    with pytest.raises(ValueError, match="unknown drafter 'nope'; available: none, auto, prompt-lookup"):
        registry.build_drafter("nope", _target())
    loads = r"this engine loads \['corpus-lookup', 'dflash', 'dspark', 'eagle3', 'hybrid'\]"
    with pytest.raises(KeyError, match=loads):
        registry.resolve_checkpoint_algo("medusa")
    (tmp_path / "config.json").write_text(json.dumps({"algo": "medusa"}))
    with pytest.raises(DraftCheckpointError, match="unknown draft algorithm 'medusa'"):
        registry.build_drafter(str(tmp_path), _target())


def test_register_and_resolve_a_new_drafter(monkeypatch):
    monkeypatch.setattr(registry, "_DRAFTERS", dict(registry._DRAFTERS))  # undone after the test
    assert registry.drafter_keywords() == ("none", "auto", "prompt-lookup", "random")
    registry.register_drafter("ngram-3", lambda target, **kw: PromptLookupDrafter(3, 3))
    assert "ngram-3" in registry.available_drafters()
    assert "ngram-3" in registry.drafter_keywords()  # the one list the stages check a --draft value against
    assert drafter_of(registry.build_drafter("ngram-3", _target()), PromptLookupDrafter).min_ngram == 3
    with pytest.raises(ValueError, match="reserved"):
        registry.register_drafter("auto", lambda target, **kw: PromptLookupDrafter())
