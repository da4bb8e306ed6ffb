"""Captured layers: DeepSpec feature_layers -> hs indices -> each engine's ids, and back.

Each engine's rule is replayed below as a few lines of that engine's own capture code (cited per test), run on a
toy residual stream whose values are the hs indices themselves: what the replay captures for the ids we write must
be the hs indices we meant.
"""

from __future__ import annotations

import pytest

from export.errors import ExportError
from export.layer_ids import (
    default_eagle3_hs,
    engine_layer_ids,
    hs_from_engine_ids,
    hs_from_feature_layers,
)


def _stream(num_layers: int) -> list[int]:
    """hs[k] for k in 0..L: the toy residual stream, hs[k] == k."""
    return list(range(num_layers + 1))


def vllm_capture(aux_layer_ids, num_layers: int) -> list[int]:
    """vllm-project/vllm vllm/model_executor/models/llama.py: `set_aux_hidden_state_layers` stores the ids as given,
    and `LlamaModel.forward` appends `hidden_states + residual` before calling layer idx (`for idx, layer in
    enumerate(...): if idx in self.aux_hidden_state_layers: aux_hidden_states.append(...)`; then `layer(...)`)."""
    hs, captured = _stream(num_layers), []
    for idx in range(num_layers):
        if idx in tuple(aux_layer_ids):
            captured.append(hs[idx])  # the stream entering layer idx
    return captured


def sglang_capture(layer_ids, num_layers: int) -> list[int]:
    """sgl-project/sglang python/sglang/srt/models/llama.py `LlamaForCausalLM.set_eagle3_layers_to_capture`:
    `layers_to_capture = [val + 1 for val in layer_ids]` (default `[2, L // 2, L - 3]` when None), and
    `LlamaModel.forward` captures `hidden_states + residual` before running layer i when `i in
    self.layers_to_capture`. The ids come from the draft's `eagle_config.eagle_aux_hidden_state_layer_ids`
    (python/sglang/srt/speculative/eagle_worker.py)."""
    to_capture = [2, num_layers // 2, num_layers - 3] if layer_ids is None else [v + 1 for v in layer_ids]
    hs, captured = _stream(num_layers), []
    for i in range(num_layers):
        if i in to_capture:
            captured.append(hs[i])
    return captured


def tensorrt_llm_capture(layers_to_capture, num_layers: int) -> list[int]:
    """NVIDIA/TensorRT-LLM tensorrt_llm/_torch/speculative/eagle3.py `Eagle3OneModelSpecMetadata`: `__post_init__`
    defaults to (1, L // 2 - 1, L - 4) and sorts given ids; the decoder calls `maybe_capture_hidden_states(layer_id,
    hidden_states, residual)` after layer `layer_id`, saving `hidden_states + residual`: the layer's output."""
    layers = (1, num_layers // 2 - 1, num_layers - 4) if layers_to_capture is None else sorted(layers_to_capture)
    hs = _stream(num_layers)
    return [hs[layer_id + 1] for layer_id in range(num_layers) if layer_id in layers]


def test_feature_layers_are_outputs_of_layers():
    # our feature layer i is the residual stream after decoder layer i = Hugging Face hidden_states[i + 1]
    assert hs_from_feature_layers((1, 14, 26)) == (2, 15, 27)


@pytest.mark.parametrize("L", [30, 32, 36])
def test_every_engine_default_names_the_same_tensors(L):
    hs = default_eagle3_hs(L)
    assert vllm_capture((2, L // 2, L - 3), L) == list(hs)  # vLLM get_eagle3_aux_hidden_state_layers
    assert sglang_capture(None, L) == list(hs)
    assert tensorrt_llm_capture(None, L) == list(hs)
    assert engine_layer_ids("vllm", hs) == [2, L // 2, L - 3]
    assert engine_layer_ids("sglang", hs) == [1, L // 2 - 1, L - 4]
    assert engine_layer_ids("tensorrt-llm", hs) == [1, L // 2 - 1, L - 4]
    assert engine_layer_ids("dflash", hs) == [1, L // 2 - 1, L - 4]


@pytest.mark.parametrize("hs", [(2, 15, 27), (2, 9, 16, 23, 29), (3, 4, 5), (1, 15, 27)])
def test_each_engine_captures_the_layers_we_write(hs):
    L = 30
    assert vllm_capture(engine_layer_ids("vllm", hs), L) == list(hs)
    assert sglang_capture(engine_layer_ids("sglang", hs), L) == list(hs)
    assert tensorrt_llm_capture(set(engine_layer_ids("tensorrt-llm", hs)), L) == list(hs)


def test_sglang_ids_written_as_hs_indices_would_read_one_layer_late():
    """Negative control of the replay: SGLang's +1 shifts ids written in vLLM's numbering by one layer."""
    assert sglang_capture(engine_layer_ids("vllm", (2, 15, 27)), 30) == [3, 16, 28]


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tensorrt-llm", "dflash"])
@pytest.mark.parametrize("hs", [(2, 15, 27), (2, 9, 16, 23, 29), (3, 4, 5), (1, 15, 27)])
def test_round_trip(engine, hs):
    assert hs_from_engine_ids(engine, engine_layer_ids(engine, hs)) == list(hs)


def test_embedding_output_is_refused():
    with pytest.raises(ExportError, match="hs\\[0\\]"):
        engine_layer_ids("vllm", (0, 3))
    with pytest.raises(ExportError, match="hs\\[0\\]"):
        engine_layer_ids("sglang", (0, 3))


def test_unknown_engine():
    with pytest.raises(ValueError, match="unknown engine 'mlc'"):
        engine_layer_ids("mlc", (2, 3))


# --- captured-layer order: refused wherever it is set ----------------------------------------------------------

#: orders no engine keeps: descending, a permutation, a repeat
BAD_ORDERS = [(14, 1, 26), (1, 26, 14), (1, 14, 14)]


@pytest.mark.parametrize("layers", BAD_ORDERS)
def test_the_engines_capture_in_layer_order_whatever_order_is_written(layers):
    """Why any other order is refused: each replayed engine hands the draft its features in layer order (and
    TensorRT-LLM de-duplicates), so a draft trained on `layers` in their written order would see its fc inputs
    permuted (or fewer) at serving time."""
    hs = hs_from_feature_layers(sorted(set(layers)))
    for captured in (
        vllm_capture(engine_layer_ids("vllm", hs), 30),
        sglang_capture(engine_layer_ids("sglang", hs), 30),
        tensorrt_llm_capture(set(engine_layer_ids("tensorrt-llm", hs)), 30),
    ):
        assert captured == sorted(set(captured)) == [i + 1 for i in sorted(set(layers))] != [i + 1 for i in layers]


@pytest.mark.parametrize("layers", BAD_ORDERS)
def test_a_non_ascending_or_repeated_order_is_refused_at_export_time(layers):
    with pytest.raises(ExportError, match=r"strictly ascending.*list them as \[1, 14"):
        hs_from_feature_layers(layers)


@pytest.mark.parametrize("layers", BAD_ORDERS)
def test_a_non_ascending_or_repeated_order_is_refused_by_the_draft_config_and_the_training_config(layers):
    from pydantic import ValidationError

    from deepspec.models.drafts.config import check_feature_layer_order
    from training.config import ModelSection

    with pytest.raises(ValueError, match="strictly ascending"):
        check_feature_layer_order(layers)
    with pytest.raises(ValidationError, match="model.feature_layers .* must be strictly ascending"):
        ModelSection(feature_layers=list(layers))
    assert ModelSection(feature_layers=sorted(set(layers))).feature_layers == sorted(set(layers))


def test_a_draft_whose_config_json_lists_layers_out_of_order_is_not_exported(tmp_path, targets):
    """A draft written before this check (or edited by hand): its config.json is read through DraftConfig.validate,
    and the export stops naming the order to use, before writing anything."""
    import json

    from tests.export.conftest import run_export, write_draft

    draft = write_draft(tmp_path / "d", targets["llama"], "eagle3", feature_layers=(1, 2, 3))
    config = json.loads((draft / "config.json").read_text())
    config["feature_layers"] = [3, 1, 2]
    (draft / "config.json").write_text(json.dumps(config))
    result = run_export("--target", targets["llama"], "--draft", draft, "--format", "vllm", "--out", tmp_path / "o")
    assert result.returncode == 2 and "strictly ascending" in result.stderr and "[1, 2, 3]" in result.stderr
    assert not (tmp_path / "o").exists()


def test_the_default_layers_of_a_shallow_target_name_each_layer_once(targets):
    """The 5 evenly spaced defaults repeat the last allowed layer on a 6-layer target; a draft sized for it keeps
    each layer once rather than being refused by its own config."""
    from deepspec.models import load_target
    from deepspec.models.drafts import DraftConfig

    target = load_target(str(targets["llama"]))
    assert len(set(target.default_feature_layers(5))) < 5
    cfg = DraftConfig.for_target(target, "eagle3")
    assert list(cfg.feature_layers) == sorted(set(target.default_feature_layers(5)))
