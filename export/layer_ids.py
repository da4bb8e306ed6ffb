"""Captured target layers, stored as `hs` indices and written in each engine's own form.

`hs[k]` is Hugging Face `output_hidden_states[k]`: `hs[0]` is the embedding output, `hs[k]` the output of decoder
layer k-1. DeepSpec drafts record `feature_layers` as "output of layer i" (the residual stream after layer i), so
`hs = i + 1`. The engines disagree on what an id means:

- vLLM / speculators `eagle_aux_hidden_state_layer_ids`: "entering layer i" = `hs[i]`; default (2, L//2, L-3).
- TensorRT-LLM `eagle3_layers_to_capture` and DFlash/DSpark `target_layer_ids` (all engines): "output of layer i"
  = `hs[i+1]`; default {1, L//2-1, L-4}.
- SGLang `eagle_aux_hidden_state_layer_ids`: `hs[i]`, except that it adds 1 to every id when the first id is 1
  (it then reads them as "output of layer" ids). `hs[1]` first is therefore not expressible and is refused.

The defaults name the same tensors everywhere; `tests/export/test_layer_ids.py` pins the conversions.
"""

from __future__ import annotations

from export.errors import ExportError

ENGINES = ("vllm", "sglang", "tensorrt-llm", "dflash")


def hs_from_feature_layers(feature_layers) -> tuple[int, ...]:
    """DeepSpec `feature_layers` ("output of layer i") -> hs indices."""
    return tuple(int(i) + 1 for i in feature_layers)


def default_eagle3_hs(num_layers: int) -> tuple[int, ...]:
    """The three layers every EAGLE-3 engine captures by default, as hs indices."""
    return (2, num_layers // 2, num_layers - 3)


def engine_layer_ids(engine: str, hs) -> list[int]:
    """hs indices -> the ids `engine` expects in its config (see the module docstring)."""
    hs = [int(i) for i in hs]
    if any(i < 1 for i in hs):
        raise ExportError(f"captured layers {hs} include hs[0] (the embedding output), which no engine captures")
    if engine == "vllm":
        return hs
    if engine == "sglang":
        if hs[0] == 1:
            raise ExportError("sglang cannot load this draft: it captures hs[1] (the output of layer 0) first, and "
                              "SGLang shifts every id by one when the first id is 1; retrain with another first layer")
        return hs
    if engine in ("tensorrt-llm", "dflash"):
        return [i - 1 for i in hs]
    raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")


def hs_from_engine_ids(engine: str, ids) -> list[int]:
    """The inverse of engine_layer_ids (for tests and for reading an engine's config back)."""
    ids = [int(i) for i in ids]
    if engine == "vllm":
        return ids
    if engine == "sglang":
        return [i + 1 for i in ids] if ids and ids[0] == 1 else ids
    if engine in ("tensorrt-llm", "dflash"):
        return [i + 1 for i in ids]
    raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
