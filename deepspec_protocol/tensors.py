"""KServe v2 tensors, encoded and decoded in one place for both ends: the gateway's requests and the worker's
responses.

Reads both encodings a peer may send (`raw_*_contents`, which tritonclient and a stock Triton use, and the typed
`contents` fields of KServe's reference clients) and writes the raw one. BYTES elements are serialised as Triton does:
a 4-byte little-endian length, then the bytes; numbers as little-endian arrays. Every tensor here is [1, n].
"""

from __future__ import annotations

import struct
from typing import TypeAlias

import numpy as np
from tritonclient.grpc import service_pb2

# protoc builds these message classes at import time, and tritonclient ships no .pyi stubs that name them
ModelInferRequest: TypeAlias = service_pb2.ModelInferRequest  # pyright: ignore[reportAttributeAccessIssue]
ModelInferResponse: TypeAlias = service_pb2.ModelInferResponse  # pyright: ignore[reportAttributeAccessIssue]

_NUMPY = {
    "BOOL": np.dtype("?"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


class TensorError(ValueError):
    """A malformed or mistyped tensor (the sender's fault: INVALID_ARGUMENT)."""


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


def encode(datatype: str, values: list) -> bytes:
    """Raw contents of a tensor holding `values` (`str` elements of a BYTES tensor are written as UTF-8)."""
    if datatype == "BYTES":
        return serialize_bytes([v.encode("utf-8") if isinstance(v, str) else v for v in values])
    return np.asarray(values, dtype=_NUMPY[datatype]).tobytes()


def add_input(request: ModelInferRequest, name: str, datatype: str, values: list) -> None:
    """Append one [1, len(values)] input, raw-encoded."""
    request.inputs.add(name=name, datatype=datatype, shape=[1, len(values)])
    request.raw_input_contents.append(encode(datatype, values))


def add_output(response: ModelInferResponse, name: str, value) -> None:
    """Append one [1, 1] output: `str` as BYTES, `int` as INT32."""
    datatype = "BYTES" if isinstance(value, str) else "INT32"
    response.outputs.add(name=name, datatype=datatype, shape=[1, 1])
    response.raw_output_contents.append(encode(datatype, [value]))


def _read(tensors, raw) -> dict[str, list]:
    values: dict[str, list] = {}
    if raw and len(raw) != len(tensors):
        raise TensorError(f"{len(raw)} raw contents for {len(tensors)} tensors")
    for i, tensor in enumerate(tensors):
        dtype = tensor.datatype
        if dtype not in _CONTENTS_FIELD:
            raise TensorError(f"tensor {tensor.name!r}: unsupported datatype {dtype}")
        if raw:
            if dtype == "BYTES":
                values[tensor.name] = deserialize_bytes(raw[i])
            else:
                try:
                    values[tensor.name] = np.frombuffer(raw[i], dtype=_NUMPY[dtype]).tolist()
                except ValueError as e:
                    raise TensorError(f"tensor {tensor.name!r}: {e}") from None
        else:
            values[tensor.name] = list(getattr(tensor.contents, _CONTENTS_FIELD[dtype]))
    return values


def read_inputs(request: ModelInferRequest) -> dict[str, list]:
    """Every input as a flat Python list (BYTES stay `bytes`), keyed by tensor name."""
    return _read(request.inputs, request.raw_input_contents)


def read_outputs(response: ModelInferResponse) -> dict[str, list]:
    """Every output as a flat Python list (BYTES stay `bytes`), keyed by tensor name."""
    return _read(response.outputs, response.raw_output_contents)


def scalar(values: dict[str, list], name: str, kind: type, default=None):
    """The single element of tensor `name` converted to `kind`, or `default` when absent."""
    items = values.get(name)
    if not items:
        return default
    if len(items) != 1:
        raise TensorError(f"tensor {name!r} must hold one element, got {len(items)}")
    item = items[0]
    if kind is str:
        try:
            return item.decode("utf-8") if isinstance(item, bytes) else str(item)
        except UnicodeDecodeError:
            raise TensorError(f"tensor {name!r} is not valid UTF-8") from None
    if isinstance(item, bytes):
        raise TensorError(f"tensor {name!r} must be numeric, got BYTES")
    return kind(item)


def strings(values: dict[str, list], name: str) -> list[str]:
    try:
        return [b.decode("utf-8") if isinstance(b, bytes) else str(b) for b in values.get(name, [])]
    except UnicodeDecodeError:
        raise TensorError(f"tensor {name!r} is not valid UTF-8") from None


def set_bool_param(response: ModelInferResponse, name: str, value: bool) -> None:
    response.parameters[name].bool_param = value
