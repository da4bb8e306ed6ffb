"""The GGUF 4-bit path: block decoding, content matching of GGUF tensors to Hugging Face weights, the cache, the
int4 matmul, and the real default target loaded with quantization="gguf"."""

from __future__ import annotations

from typing import cast

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType, GGUFWriter, dequantize, quantize

from deepspec.models.gguf_int4 import Int4Blocks, cached_int4_weights, decode_tensor, int4_weights
from deepspec.models.packed_linear import Int4Weight, OneDNNWeight, onednn_pack


def _random_q4_k(rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Raw Q4_K bytes (gguf-py cannot quantize to Q4_K): random codes and scales, valid fp16 d and dmin."""
    blocks = rng.integers(0, 256, size=(rows * cols // 256, 144), dtype=np.uint8)
    blocks[:, 0:2] = rng.uniform(0.001, 0.01, size=(len(blocks), 1)).astype(np.float16).view(np.uint8)
    blocks[:, 2:4] = rng.uniform(0.001, 0.01, size=(len(blocks), 1)).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q4_K"])
def test_decoded_blocks_dequantize_like_gguf(qtype):
    rng = np.random.default_rng(0)
    t = GGMLQuantizationType[qtype]
    raw = _random_q4_k(6, 512, rng) if qtype == "Q4_K" else quantize(rng.standard_normal((6, 512), np.float32), t)
    blocks = decode_tensor(raw, qtype)
    assert blocks.shape == (6, 512) and int(blocks.codes.max()) <= 15
    expected = torch.from_numpy(dequantize(raw, t))
    torch.testing.assert_close(blocks.dequantize(), expected, rtol=1e-6, atol=1e-7)


def _write_gguf(path, tensors: dict[str, tuple[np.ndarray, GGMLQuantizationType]]) -> None:
    writer = GGUFWriter(str(path), "llama")
    for name, (raw, qtype) in tensors.items():
        writer.add_tensor(name, raw, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_weights_are_matched_by_content_through_row_permutations(tmp_path):
    rng = np.random.default_rng(1)
    q4_1 = GGMLQuantizationType.Q4_1
    raws = {f"blk.{i}.attn_q.weight": quantize(rng.standard_normal((8, 64), np.float32), q4_1) for i in range(2)}
    raws["blk.0.ffn_down.weight"] = quantize(rng.standard_normal((4, 64), np.float32), GGMLQuantizationType.Q4_0)
    gguf = tmp_path / "tiny.gguf"
    types = {n: q4_1 if "attn" in n else GGMLQuantizationType.Q4_0 for n in raws}
    _write_gguf(gguf, {n: (r, types[n]) for n, r in raws.items()})

    perm = torch.tensor([1, 0, 3, 2, 5, 4, 7, 6])  # like llama.cpp's q/k row interleave, undone by transformers
    dense = {n: torch.from_numpy(dequantize(r, types[n])) for n, r in raws.items()}
    state = {
        # the two same-shape tensors in the opposite order to the file, so a shape-only match would swap them
        "model.layers.0.self_attn.q_proj.weight": dense["blk.1.attn_q.weight"][perm],
        "model.layers.1.self_attn.q_proj.weight": dense["blk.0.attn_q.weight"],
        "model.layers.0.mlp.down_proj.weight": dense["blk.0.ffn_down.weight"],
        "model.layers.1.mlp.down_proj.weight": torch.randn(4, 64),  # in no 4-bit tensor: stays dense
        "model.norm.weight": torch.ones(64),
    }
    found = int4_weights(gguf, state)
    assert set(found) == {
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.1.self_attn.q_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
    }
    for name, blocks in found.items():
        torch.testing.assert_close(blocks.dequantize(), state[name], rtol=1e-5, atol=1e-7)

    first = cached_int4_weights(gguf, tmp_path, state)
    assert (tmp_path / "int4.safetensors").is_file()
    again = cached_int4_weights(gguf, tmp_path, {})  # from the cache file: the state is not needed any more
    assert set(again) == set(first)
    for name in first:
        for field in ("codes", "scale", "zero"):
            assert torch.equal(getattr(again[name], field), getattr(first[name], field)), (name, field)


def test_int4_matmul_equals_dense_matmul_on_the_dequantized_weight():
    torch.manual_seed(0)
    blocks = Int4Blocks(
        torch.randint(0, 16, (48, 96), dtype=torch.uint8), torch.rand(48, 3) * 0.02, torch.randn(48, 3) * 0.01
    )
    x, bias = torch.randn(2, 3, 96), torch.randn(48)
    out = Int4Weight(blocks, torch.float32)(x, bias)
    torch.testing.assert_close(out, F.linear(x, blocks.dequantize(), bias), rtol=1e-5, atol=1e-5)
    assert out.shape == (2, 3, 48)


def test_wide_inputs_run_on_the_dense_copy():
    calls = []
    blocks = Int4Blocks(torch.zeros(16, 32, dtype=torch.uint8), torch.ones(16, 1), torch.zeros(16, 1))
    # a stand-in for the dense oneDNN weight (a CPU-only packing) that records the inputs it gets
    dense = cast(OneDNNWeight, lambda x, bias: calls.append(x.shape) or x.new_zeros(1))
    weight = Int4Weight(blocks, torch.float32, dense=dense)
    weight(torch.randn(1, Int4Weight.MAX_ROWS, 32))
    assert calls == []
    weight(torch.randn(1, Int4Weight.MAX_ROWS + 1, 32))
    assert calls == [(1, Int4Weight.MAX_ROWS + 1, 32)]


def test_cat_stacks_along_the_output_dimension():
    a = Int4Blocks(torch.zeros(2, 32, dtype=torch.uint8), torch.ones(2, 1), torch.zeros(2, 1))
    b = Int4Blocks(torch.full((3, 32), 15, dtype=torch.uint8), torch.ones(3, 1), torch.zeros(3, 1))
    both = Int4Blocks.cat([a, b])
    assert both.shape == (5, 32)
    torch.testing.assert_close(both.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))


def test_quantization_errors_are_clear(tmp_path):
    from deepspec.models import load_target

    with pytest.raises(ValueError, match="unknown quantization 'int2'"):
        load_target("smollm2-135m", dtype="bfloat16", quantization="int2")
    with pytest.raises(ValueError, match="needs --dtype bfloat16"):
        load_target("smollm2-135m", dtype="float32", quantization="gguf")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="needs a GGUF target"):
        load_target(str(tmp_path), dtype="bfloat16", quantization="gguf")


@pytest.mark.slow
def test_default_target_runs_its_own_4bit_weights(smollm2):
    """Every layer matmul of SmolLM2 is Q4_1 in the GGUF: all 120 fused matmuls go 4-bit, and the logits stay
    those of the fp32 dense model within bf16 noise (top-1 agreement on a real prompt)."""
    from deepspec.models import load_target, pytorch_decoder

    q4 = load_target("smollm2-135m", dtype="bfloat16", quantization="gguf")
    assert q4.quantization == "gguf"
    names = ("wqkv", "wo", "w_gate_up", "w_down")
    packed = [layer.packed[name] for layer in pytorch_decoder(q4).decoder_layers() for name in names]
    int4 = [w for w in packed if isinstance(w, Int4Weight)]
    assert len(packed) == 120 and len(int4) == len(packed)
    # the dense copy for wide passes exists exactly where this CPU's torch packs oneDNN bf16 (not on every EPYC)
    has_onednn = onednn_pack(torch.zeros(8, 8, dtype=torch.bfloat16)) is not None
    assert all((w.dense is not None) == has_onednn for w in int4)
    ids = torch.tensor([smollm2.encode('def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n')])
    start = torch.zeros(1, dtype=torch.long)
    with torch.no_grad():
        dense, quant = smollm2.forward(ids, start).logits, q4.forward(ids, start).logits
    assert dense is not None and quant is not None
    agree = (dense.argmax(-1) == quant.argmax(-1)).float().mean().item()
    assert agree >= 0.9, agree
