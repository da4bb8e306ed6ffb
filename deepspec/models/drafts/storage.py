"""How a draft's weights sit in model.safetensors (config.json `storage_dtype`), and how they come back as floats.

Why several forms: the shipped drafts travel inside the repository, whose tracked tree has a size limit
(tests/test_repo_size.py), so the smaller the file the more room for data beside it. Every form is read back as
float32 tensors (`restored_tensors`) and cast to the compute dtype on load, so nothing downstream (the engine,
export/) sees how they were stored.

- float32, bfloat16: every floating tensor in that dtype.
- int8: each matrix as int8 with one float32 scale per output row (`<name>` + `<name>.int8_scale`, symmetric,
  |w - q·scale| <= scale/2); vectors (norms, biases) in bf16. About a quarter of the float32 size.
- q4: each matrix whose input size is a multiple of 32 as 4-bit blocks, GGUF's Q4_1 numbers
  (deepspec/models/q4_weights.py): per output row, blocks of 32 inputs, each with a float16 scale d and minimum m
  and a 4-bit level q per weight, w = d·q + m (|w - (d·q + m)| <= d/2). Stored as `<name>` (uint8 [N, K/2], two
  levels a byte, the nibble order of gguf_int4's cache) + `<name>.q4_scale` and `<name>.q4_min` (float16 [N, K/32]):
  0.625 bytes a weight against int8's ~1. Other matrices as int8, vectors in bf16, as int8 storage keeps them.

Integer buffers (d2t/t2d, vocabulary maps) are stored as they are in every form.
"""

from __future__ import annotations

import torch

from deepspec.models.gguf_int4 import pack_nibbles, unpack_nibbles
from deepspec.models.q4_weights import BLOCK
from deepspec.models.q4_weights import dequantize_q4 as dequantize_q4_blocks
from deepspec.models.q4_weights import quantize_q4 as quantize_q4_blocks

#: how save_draft may store the weights (config.json `storage_dtype`)
STORAGE_DTYPES = ("float32", "bfloat16", "int8", "q4")
#: suffix of the per-output-row scale beside each int8 matrix in model.safetensors
INT8_SCALE_SUFFIX = ".int8_scale"
#: suffixes of the per-block scale and minimum beside each q4 matrix's packed levels
Q4_SCALE_SUFFIX = ".q4_scale"
Q4_MIN_SUFFIX = ".q4_min"
_SIDE_SUFFIXES = (INT8_SCALE_SUFFIX, Q4_SCALE_SUFFIX, Q4_MIN_SUFFIX)


class StoredWeightsError(ValueError):
    """model.safetensors holds tensors that do not fit together (a quantized matrix without its scales)."""


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """([out, in] int8, [out] float32 scale): symmetric per output row, scale = max|row| / 127 (an all-zero row
    gets scale 1, so it dequantizes to zeros)."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """[out, in] float32 from quantize_int8's pair."""
    return q.float() * scale.float()[:, None]


def quantize_q4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(packed levels [out, in/2] uint8, scale [out, in/32] float16, minimum [out, in/32] float16) of a matrix whose
    input size is a multiple of 32: q4_weights' Q4_1 blocks, two levels a byte."""
    q, d, m = quantize_q4_blocks(weight.detach().float().cpu().numpy())
    return pack_nibbles(torch.from_numpy(q)).contiguous(), torch.from_numpy(d), torch.from_numpy(m)


def dequantize_q4(packed: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> torch.Tensor:
    """[out, in] float32 from quantize_q4's triple, computed as ggml does (d·q + m in float32)."""
    levels = unpack_nibbles(packed).numpy()
    return torch.from_numpy(dequantize_q4_blocks(levels, scale.numpy(), minimum.numpy()))


def stored_tensors(state: dict[str, torch.Tensor], storage_dtype: str) -> dict[str, torch.Tensor]:
    """The tensors model.safetensors holds for `state` stored as `storage_dtype` (module docstring)."""
    if storage_dtype not in STORAGE_DTYPES:
        raise ValueError(f"unknown storage_dtype '{storage_dtype}'; available: {list(STORAGE_DTYPES)}")
    out = {}
    for name, tensor in state.items():
        tensor = tensor.detach().to("cpu")
        if not tensor.is_floating_point():
            out[name] = tensor.contiguous()
        elif storage_dtype in ("int8", "q4") and tensor.ndim == 2:
            in_blocks = storage_dtype == "q4" and tensor.shape[1] % BLOCK == 0
            out |= _quantized_entries(name, tensor, state, "q4" if in_blocks else "int8")
        else:
            dtype = torch.float32 if storage_dtype == "float32" else torch.bfloat16
            out[name] = tensor.to(dtype).contiguous()
    return out


def _quantized_entries(
    name: str, tensor: torch.Tensor, state: dict[str, torch.Tensor], form: str
) -> dict[str, torch.Tensor]:
    """`name`'s matrix as `form` ("int8" or "q4"): the codes under its own name, the scales under suffixed ones."""
    suffixes = (INT8_SCALE_SUFFIX,) if form == "int8" else (Q4_SCALE_SUFFIX, Q4_MIN_SUFFIX)
    taken = [name + s for s in suffixes if name + s in state]
    if taken:
        raise ValueError(f"cannot store {name} as {form}: the model already has a tensor named {taken[0]}")
    parts = quantize_int8(tensor) if form == "int8" else quantize_q4(tensor)
    return dict(zip((name, *(name + s for s in suffixes)), parts, strict=True))


def restored_tensors(stored: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    """model.safetensors' tensors (`stored`, read from `where`) as the model's state dict: int8 and q4 matrices
    dequantized to float32, every other tensor as stored. StoredWeightsError names a quantized matrix whose
    scales are missing or do not fit it, and a scale with no matrix."""
    state = {}
    for name, tensor in stored.items():
        side = next((s for s in _SIDE_SUFFIXES if name.endswith(s)), None)
        if side is not None:
            if name[: -len(side)] not in stored:
                raise StoredWeightsError(f"{where}: scale {name} has no quantized matrix beside it")
            continue
        if name + Q4_SCALE_SUFFIX in stored or name + Q4_MIN_SUFFIX in stored:
            state[name] = _restored_q4(name, stored, where)
        elif tensor.dtype == torch.int8 or name + INT8_SCALE_SUFFIX in stored:
            state[name] = _restored_int8(name, stored, where)
        else:
            state[name] = tensor
    return state


def _restored_int8(name: str, stored: dict[str, torch.Tensor], where: str) -> torch.Tensor:
    tensor, scale = stored[name], stored.get(name + INT8_SCALE_SUFFIX)
    if tensor.dtype != torch.int8:
        raise StoredWeightsError(f"{where}: {name} is {tensor.dtype}, but a scale is stored for it")
    if scale is None or tensor.ndim != 2 or scale.shape != tensor.shape[:1]:
        raise StoredWeightsError(
            f"{where}: int8 tensor {name} {tuple(tensor.shape)} needs a [{tensor.shape[0]}] "
            f"{name + INT8_SCALE_SUFFIX} beside it; re-save the draft with save_draft(storage_dtype='int8')"
        )
    return dequantize_int8(tensor, scale)


def _restored_q4(name: str, stored: dict[str, torch.Tensor], where: str) -> torch.Tensor:
    packed, scale, minimum = stored[name], stored.get(name + Q4_SCALE_SUFFIX), stored.get(name + Q4_MIN_SUFFIX)
    rows, half = packed.shape if packed.ndim == 2 else (0, 0)
    blocks = [rows, 2 * half // BLOCK]
    fits = packed.dtype == torch.uint8 and packed.ndim == 2 and (2 * half) % BLOCK == 0
    if not fits or any(t is None or t.dtype != torch.float16 or list(t.shape) != blocks for t in (scale, minimum)):
        raise StoredWeightsError(
            f"{where}: q4 tensor {name} needs uint8 levels [N, K/2] with float16 {name + Q4_SCALE_SUFFIX} and "
            f"{name + Q4_MIN_SUFFIX} [N, K/32] beside it, got {packed.dtype} {tuple(packed.shape)}; re-save the "
            "draft with save_draft(storage_dtype='q4')"
        )
    assert scale is not None and minimum is not None  # checked just above
    return dequantize_q4(packed, scale, minimum)
