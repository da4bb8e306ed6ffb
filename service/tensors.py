"""KServe v2 tensor (de)serialisation for the few small tensors the worker protocol uses.

Reads both encodings a client may send (`raw_input_contents`, which tritonclient uses, and the typed `contents`
fields) and writes `raw_output_contents`, which `tritonclient`'s `InferResult.as_numpy` and a stock Triton both
use. BYTES elements are serialised as Triton does: a 4-byte little-endian length, then the bytes.
"""

from __future__ import annotations

import struct

import numpy as np
from tritonclient.grpc import service_pb2

_NUMPY = {
    "BOOL": np.bool_, "INT32": np.int32, "INT64": np.int64, "UINT32": np.uint32, "UINT64": np.uint64,
    "FP32": np.float32, "FP64": np.float64,
}  # fmt: skip
_CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT32": "int_contents", "INT64": "int64_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}  # fmt: skip


class TensorError(ValueError):
    """A malformed or mistyped input tensor (the client's fault: INVALID_ARGUMENT)."""


def deserialize_bytes(raw: bytes) -> list[bytes]:
    items, offset = [], 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise TensorError("truncated BYTES tensor")
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + length > len(raw):
            raise TensorError("truncated BYTES tensor")
        items.append(raw[offset : offset + length])
        offset += length
    return items


def serialize_bytes(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


def read_inputs(request: service_pb2.ModelInferRequest) -> dict[str, list]:
    """Every input as a flat Python list (BYTES stay `bytes`), keyed by tensor name."""
    values: dict[str, list] = {}
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise TensorError(f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs")
    for i, tensor in enumerate(request.inputs):
        dtype = tensor.datatype
        if dtype not in _CONTENTS_FIELD:
            raise TensorError(f"input {tensor.name!r}: unsupported datatype {dtype}")
        if raw:
            if dtype == "BYTES":
                values[tensor.name] = deserialize_bytes(raw[i])
            else:
                try:
                    values[tensor.name] = np.frombuffer(raw[i], dtype=_NUMPY[dtype]).tolist()
                except ValueError as e:
                    raise TensorError(f"input {tensor.name!r}: {e}") from None
        else:
            values[tensor.name] = list(getattr(tensor.contents, _CONTENTS_FIELD[dtype]))
    return values


def scalar(values: dict[str, list], name: str, kind: type, default=None):
    """The single element of input `name` converted to `kind`, or `default` when absent."""
    items = values.get(name)
    if not items:
        return default
    if len(items) != 1:
        raise TensorError(f"input {name!r} must hold one element, got {len(items)}")
    item = items[0]
    if kind is str:
        try:
            return item.decode("utf-8") if isinstance(item, bytes) else str(item)
        except UnicodeDecodeError:
            raise TensorError(f"input {name!r} is not valid UTF-8") from None
    if isinstance(item, bytes):
        raise TensorError(f"input {name!r} must be numeric, got BYTES")
    return kind(item)


def strings(values: dict[str, list], name: str) -> list[str]:
    try:
        return [b.decode("utf-8") if isinstance(b, bytes) else str(b) for b in values.get(name, [])]
    except UnicodeDecodeError:
        raise TensorError(f"input {name!r} is not valid UTF-8") from None


def add_output(response: service_pb2.ModelInferResponse, name: str, value) -> None:
    """Append one [1, 1] output: `str` as BYTES, `int` as INT32."""
    out = response.outputs.add(name=name, shape=[1, 1])
    if isinstance(value, str):
        out.datatype = "BYTES"
        response.raw_output_contents.append(serialize_bytes([value.encode("utf-8")]))
    else:
        out.datatype = "INT32"
        response.raw_output_contents.append(struct.pack("<i", value))


def set_bool_param(response: service_pb2.ModelInferResponse, name: str, value: bool) -> None:
    response.parameters[name].bool_param = value
