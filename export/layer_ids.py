"""Captured target layers, stored as `hs` indices and written in each engine's own form.

`hs[k]` is Hugging Face `output_hidden_states[k]`: `hs[0]` is the embedding output, `hs[k]` the output of decoder
layer k-1 (the residual stream entering layer k). DeepSpec drafts record `feature_layers` as "output of layer i",
so `hs = i + 1`. What each engine makes of a configured id i, read from its own code:

- vLLM `eagle_aux_hidden_state_layer_ids` (the speculators config, or `eagle_config` of the draft): the model's
  `set_aux_hidden_state_layers` takes the ids as they are and `LlamaModel.forward` appends `hidden_states +
  residual` *before* running layer i, so i reads `hs[i]`. Default `get_eagle3_aux_hidden_state_layers`:
  (2, L//2, L-3).
- SGLang `eagle_config.eagle_aux_hidden_state_layer_ids` of the draft: every model's
  `set_eagle3_layers_to_capture` stores `[i + 1 for i in layer_ids]` as `layers_to_capture`, and the model captures
  *before* layer `i + 1`, so i reads `hs[i + 1]`: an "output of layer i" id. Its default (no ids configured) is
  `layers_to_capture = [2, L//2, L-3]`, i.e. configured ids [1, L//2-1, L-4].
- TensorRT-LLM `eagle3_layers_to_capture` (the LLM-API speculative_config; the draft's config.json is not read for
  it): `Eagle3OneModelSpecMetadata.maybe_capture_hidden_states(layer_id, hidden_states, residual)` runs after layer
  i, so i reads `hs[i + 1]`; default {1, L//2-1, L-4}.
- DFlash / DSpark `dflash_config.target_layer_ids` (vLLM, SGLang): "output of layer i" = `hs[i + 1]`.

The defaults name the same tensors everywhere: hs (2, L//2, L-3). `tests/export/test_layer_ids.py` pins each rule
with the upstream function it comes from.
"""

from __future__ import annotations

from export.errors import ExportError

#: engine -> how far its configured ids sit below hs indices (0: "entering layer i", 1: "output of layer i")
_OFFSETS = {"vllm": 0, "sglang": 1, "tensorrt-llm": 1, "dflash": 1}
ENGINES = tuple(_OFFSETS)


def hs_from_feature_layers(feature_layers) -> tuple[int, ...]:
    """DeepSpec `feature_layers` ("output of layer i") -> hs indices; ExportError for an order no engine keeps
    (deepspec/models/drafts/config.py `check_feature_layer_order`: the engines capture in layer order)."""
    from deepspec.models.drafts.config import check_feature_layer_order

    try:
        check_feature_layer_order(feature_layers, "the draft's captured layers (feature_layers)")
    except ValueError as e:
        raise ExportError(str(e)) from None
    return tuple(int(i) + 1 for i in feature_layers)


def default_eagle3_hs(num_layers: int) -> tuple[int, ...]:
    """The three layers every EAGLE-3 engine captures by default, as hs indices."""
    return (2, num_layers // 2, num_layers - 3)


def _offset(engine: str) -> int:
    if engine not in _OFFSETS:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    return _OFFSETS[engine]


def engine_layer_ids(engine: str, hs) -> list[int]:
    """hs indices -> the ids `engine` expects in its config (see the module docstring)."""
    offset, hs = _offset(engine), [int(i) for i in hs]
    if any(i < 1 for i in hs):
        raise ExportError(f"captured layers {hs} include hs[0] (the embedding output), which no engine captures")
    return [i - offset for i in hs]


def hs_from_engine_ids(engine: str, ids) -> list[int]:
    """The inverse of engine_layer_ids (for tests and for reading an engine's config back)."""
    offset = _offset(engine)
    return [int(i) + offset for i in ids]
