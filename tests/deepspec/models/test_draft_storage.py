"""q4 storage of draft weights (deepspec/models/drafts/storage.py): GGUF Q4_1 blocks for every matrix whose input
size is a multiple of 32, int8 for the other matrices, bf16 vectors, integer buffers untouched; read back as float32
within half a block's step; loaded, converted and exported like the other storage dtypes."""

from __future__ import annotations

import json

import pytest
import torch

from deepspec.models.drafts import (
    DraftCheckpointError,
    convert_draft_storage,
    load_draft,
    read_draft_weights,
    save_draft,
)
from deepspec.models.drafts.storage import (
    BLOCK,
    Q4_MIN_SUFFIX,
    Q4_SCALE_SUFFIX,
    dequantize_q4,
    quantize_int8,
    quantize_q4,
)
from tests.training.helpers import tiny_draft, tiny_target

DRAFTS = ["eagle3", "dflash", "dspark", "eagle3-canonical"]


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def _draft(target, name: str):
    """One tiny draft of each algorithm and layout (hidden 32: most matrices fit the blocks, DSpark's markov ones
    do not), with a draft vocabulary as the shipped ones have."""
    if name == "eagle3-canonical":
        return tiny_draft(target, "eagle3", draft_vocab_size=24, layout="canonical")
    return tiny_draft(target, name, draft_vocab_size=24)


def _stored(path):
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


@pytest.mark.parametrize("name", DRAFTS)
def test_q4_storage_is_within_half_a_block_step_of_each_weight(target, name, tmp_path):
    """Every block-sized matrix comes back within half its block's step d of the float32 weight; the others as
    int8 does (half a row step); vectors as their bf16 cast; integer buffers exactly."""
    draft = _draft(target, name)
    path = save_draft(draft, tmp_path / "q4", storage_dtype="q4")
    assert json.loads((path / "config.json").read_text())["storage_dtype"] == "q4"
    stored, restored = _stored(path), read_draft_weights(path)
    assert set(restored) == set(draft.state_dict())
    in_blocks = 0
    for key, original in draft.state_dict().items():
        got = restored[key]
        if not original.is_floating_point():
            assert torch.equal(got, original), key
        elif original.ndim == 2 and original.shape[1] % BLOCK == 0:
            in_blocks += 1
            assert stored[key].dtype == torch.uint8 and list(stored[key].shape) == [
                original.shape[0],
                original.shape[1] // 2,
            ]
            half_step = stored[key + Q4_SCALE_SUFFIX].float().repeat_interleave(BLOCK, dim=1) / 2
            assert got.dtype == torch.float32 and bool(((got - original).abs() <= half_step * 1.001 + 1e-7).all()), key
        elif original.ndim == 2:
            assert stored[key].dtype == torch.int8, key
            assert torch.equal(got, quantize_int8(original)[0].float() * quantize_int8(original)[1][:, None]), key
        else:
            assert torch.equal(got, original.to(torch.bfloat16).float()), key
    assert in_blocks >= 5


def test_q4_blocks_are_q4_weights_ones_and_smaller_than_int8(target, tmp_path):
    """The stored blocks are exactly GGUF Q4_1's (q4_weights.quantize_q4: the native decoder's), two levels a byte
    in gguf_int4's nibble order; the file is smaller than the int8 one by about the 1 → 0.625 bytes a weight."""
    from deepspec.models.gguf_int4 import unpack_nibbles
    from deepspec.models.q4_weights import quantize_q4 as q4_blocks

    draft = _draft(target, "eagle3-canonical")
    q4 = save_draft(draft, tmp_path / "q4", storage_dtype="q4")
    int8 = save_draft(draft, tmp_path / "int8", storage_dtype="int8")
    stored = _stored(q4)
    w = draft.state_dict()["fc.weight"]
    q, d, m = q4_blocks(w.numpy())
    assert torch.equal(unpack_nibbles(stored["fc.weight"]), torch.from_numpy(q))
    assert torch.equal(stored["fc.weight" + Q4_SCALE_SUFFIX], torch.from_numpy(d))
    assert torch.equal(stored["fc.weight" + Q4_MIN_SUFFIX], torch.from_numpy(m))
    assert (q4 / "model.safetensors").stat().st_size < 0.8 * (int8 / "model.safetensors").stat().st_size


def test_q4_round_trip_of_a_known_matrix():
    """A block holding 0..15 times a step is stored exactly (its min and max are levels); a constant block comes
    back as its constant; an odd block is within half its step."""
    ramp = torch.arange(32, dtype=torch.float32) % 16 * 0.25 - 1.0
    w = torch.stack([ramp, torch.full((32,), 0.5), torch.linspace(-3.0, 7.0, 32)])
    packed, scale, minimum = quantize_q4(w)
    assert packed.shape == (3, 16) and scale.shape == minimum.shape == (3, 1)
    back = dequantize_q4(packed, scale, minimum)
    assert torch.equal(back[:2], w[:2])
    assert float((back[2] - w[2]).abs().max()) <= float(scale[2, 0]) / 2 * 1.001
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q4(torch.zeros(2, 48))


@pytest.mark.parametrize("name", DRAFTS)
def test_q4_draft_loads_to_the_compute_dtype_and_predicts_close_to_the_original(target, name, tmp_path):
    """Loaded from q4 the draft computes in the target's dtype with the dequantized weights (nothing else changes:
    same logits as the float32 draft holding those weights)."""
    draft = _draft(target, name).eval()
    path = save_draft(draft, tmp_path / name, storage_dtype="q4")
    loaded = load_draft(path, target)
    assert loaded.fc.weight.dtype == torch.float32
    draft.load_state_dict(read_draft_weights(path))
    assert all(torch.equal(a, b) for a, b in zip(draft.state_dict().values(), loaded.state_dict().values()))


def _broken(good: dict[str, torch.Tensor], how: str) -> dict[str, torch.Tensor]:
    scale = "fc.weight" + Q4_SCALE_SUFFIX
    if how == "scale missing":
        return {k: v for k, v in good.items() if k != scale}
    if how == "scale in float32":
        return {**good, scale: good[scale].float()}
    if how == "levels cut short":
        return {**good, "fc.weight": good["fc.weight"][:, :-16].contiguous()}
    return {k: v for k, v in good.items() if k != "fc.weight"}  # "levels missing"


@pytest.mark.parametrize("how", ["scale missing", "scale in float32", "levels cut short", "levels missing"])
def test_q4_checkpoints_with_missing_or_wrong_blocks_fail_clearly(target, tmp_path, how):
    from safetensors.torch import save_file

    path = save_draft(tiny_draft(target, "dflash"), tmp_path / "d", storage_dtype="q4")
    save_file(_broken(_stored(path), how), path / "model.safetensors")
    if how == "levels missing":
        match = r"scale fc.weight.q4_\w+ has no quantized matrix"
    else:
        match = r"q4 tensor fc.weight needs uint8 levels \[N, K/2\] with float16 fc.weight.q4_scale"
    with pytest.raises(DraftCheckpointError, match=match):
        load_draft(path, target)


def test_convert_to_q4_keeps_the_config_and_rounds_once_from_bf16(target, tmp_path):
    """`python -m training store --storage-dtype q4` on a bf16 draft: every config key survives, the weights are
    the q4 blocks of the bf16 ones (one rounding), and converting back to int8 works from q4 too."""
    from deepspec.models.drafts.storage import stored_tensors

    draft = tiny_draft(target, "dspark", draft_vocab_size=24, confidence_temperature=(1.1, 0.9, 0.8, 0.7))
    path = save_draft(draft, tmp_path / "d", storage_dtype="bfloat16")
    before = json.loads((path / "config.json").read_text())
    bf16 = read_draft_weights(path)
    report = convert_draft_storage(path, "q4")
    assert json.loads((path / "config.json").read_text()) == {**before, "storage_dtype": "q4"}
    assert report["bytes_after"] < report["bytes_before"] / 2
    want = stored_tensors(bf16, "q4")
    got = _stored(path)
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    convert_draft_storage(path, "int8")
    assert load_draft(path, target) is not None


def test_export_reads_q4_drafts_as_float_weights(target, tmp_path):
    """export/ writes each engine's dialect from DraftSource.weights: a q4-stored draft comes back as its
    dequantized float32 tensors, not as packed levels beside stray block tensors."""
    from deepspec.models.drafts import read_checkpoint_header, read_draft_config
    from export.sources import DraftSource

    path = save_draft(_draft(target, "eagle3-canonical"), tmp_path / "d", storage_dtype="q4")
    weights = DraftSource(path, read_checkpoint_header(path), read_draft_config(path)).weights()
    want = read_draft_weights(path)
    assert set(weights) == set(want) and all(torch.equal(weights[k], want[k]) for k in want)
    assert weights["lm_head.weight"].dtype == torch.float32


def test_the_store_command_converts_to_q4_and_names_bad_drafts(target, tmp_path, capsys):
    """`python -m training store --storage-dtype q4`: one JSON line per draft with the bytes before and after; a
    directory that is not a neural draft is an error with exit status 2, not a traceback."""
    from training.__main__ import main

    path = save_draft(_draft(target, "dflash"), tmp_path / "d", storage_dtype="int8")
    assert main(["store", "--draft", str(path), "--storage-dtype", "q4"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["storage_dtype"] == "q4" and report["bytes_after"] < report["bytes_before"]
    assert json.loads((path / "config.json").read_text())["storage_dtype"] == "q4"
    assert main(["store", "--draft", str(tmp_path / "nothing"), "--storage-dtype", "q4"]) == 2
    assert "config.json is missing" in capsys.readouterr().err


def _shipped_neural_drafts() -> list:
    from deepspec.models.drafts import shipped_drafts_dir

    return sorted(
        p
        for p in shipped_drafts_dir().iterdir()
        if (p / "model.safetensors").is_file() and json.loads((p / "config.json").read_text()).get("algo") != "hybrid"
    )


@pytest.mark.parametrize("path", _shipped_neural_drafts(), ids=lambda p: p.name)
def test_shipped_drafts_are_stored_as_their_config_says(path):
    """Each shipped neural draft holds what its config.json's storage_dtype promises: for q4 every block-sized
    matrix in 4-bit blocks (the rest int8), and it reads back as float32 matrices; dequantized q4 matrices are the
    native decoder's q4 blocks exactly (q4_weights.exact_q4), so running them natively in q4 rounds nothing again."""
    from deepspec.models.q4_weights import exact_q4

    stored, restored = _stored(path), read_draft_weights(path)
    storage = json.loads((path / "config.json").read_text())["storage_dtype"]
    matrices = {k: v for k, v in restored.items() if v.is_floating_point() and v.ndim == 2}
    assert matrices and all(v.dtype == torch.float32 for v in matrices.values())
    for key, w in matrices.items():
        if storage == "q4" and w.shape[1] % BLOCK == 0:
            assert stored[key].dtype == torch.uint8 and key + Q4_SCALE_SUFFIX in stored, key
            assert exact_q4(w.numpy()) is not None, key
        elif storage in ("q4", "int8"):
            assert stored[key].dtype == torch.int8, key


def test_training_saves_in_every_storage_dtype():
    """`save_dtype` in a training config takes exactly the storage dtypes save_draft knows, q4 included."""
    from typing import get_args

    from deepspec.models.drafts import STORAGE_DTYPES
    from training.config import TrainConfig

    assert get_args(TrainConfig.model_fields["save_dtype"].annotation) == STORAGE_DTYPES
