"""Captured layers: DeepSpec feature_layers -> hs indices -> each engine's ids, and back."""

from __future__ import annotations

import pytest

from export.errors import ExportError
from export.layer_ids import (
    default_eagle3_hs,
    engine_layer_ids,
    hs_from_engine_ids,
    hs_from_feature_layers,
)


def test_feature_layers_are_outputs_of_layers():
    # our feature layer i is the residual stream after decoder layer i = Hugging Face hidden_states[i + 1]
    assert hs_from_feature_layers((1, 14, 26)) == (2, 15, 27)


@pytest.mark.parametrize("L", [30, 32, 36])
def test_every_engine_default_names_the_same_tensors(L):
    hs = default_eagle3_hs(L)
    assert engine_layer_ids("vllm", hs) == [2, L // 2, L - 3]
    assert engine_layer_ids("sglang", hs) == [2, L // 2, L - 3]
    assert engine_layer_ids("tensorrt-llm", hs) == [1, L // 2 - 1, L - 4]
    assert engine_layer_ids("dflash", hs) == [1, L // 2 - 1, L - 4]


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tensorrt-llm", "dflash"])
@pytest.mark.parametrize("hs", [(2, 15, 27), (2, 9, 16, 23, 29), (3, 4, 5)])
def test_round_trip(engine, hs):
    assert hs_from_engine_ids(engine, engine_layer_ids(engine, hs)) == list(hs)


def test_sglang_shift_makes_hs1_first_unwritable():
    # SGLang adds one to every id when the first is 1: hs[1] first would silently become hs[2]
    assert hs_from_engine_ids("sglang", [1, 15, 27]) == [2, 16, 28]
    with pytest.raises(ExportError, match="sglang cannot load"):
        engine_layer_ids("sglang", (1, 15, 27))
    assert engine_layer_ids("vllm", (1, 15, 27)) == [1, 15, 27]


def test_embedding_output_is_refused():
    with pytest.raises(ExportError, match="hs\\[0\\]"):
        engine_layer_ids("vllm", (0, 3))
