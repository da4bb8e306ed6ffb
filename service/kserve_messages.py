"""The KServe v2 messages the worker and the gateway build and read, typed once for the checker.

tritonclient ships its generated `service_pb2` and `model_config_pb2` without `.pyi` stubs, and protobuf creates
their message classes and enum values when the module is imported, so a type checker sees none of their names
(`service_pb2.ModelInferRequest` reads as an unknown attribute). They are declared `Any` here, in one place, instead
of silenced at each use; `service_pb2_grpc` is plain Python and is imported from tritonclient directly.

`scalar` is `deepspec_protocol.tensors.scalar` with its result typed by the kind asked for (an `int` tensor read
with an `int` default is an `int`), which the untyped original leaves to each caller.
"""

from typing import Any, TypeAlias, TypeVar, overload

from tritonclient.grpc import model_config_pb2 as _model_config_pb2
from tritonclient.grpc import service_pb2 as _service_pb2

from deepspec_protocol import tensors

#: KServe v2 requests and responses (ModelInferRequest, ServerReadyResponse, ...)
service_pb2: Any = _service_pb2
#: Triton's model configuration messages and their data types (ModelConfig, TYPE_FP32, ...)
model_config_pb2: Any = _model_config_pb2

#: the messages the worker and the gateway name in their signatures (Any, as the modules above)
ModelConfig: TypeAlias = Any
ModelInferRequest: TypeAlias = Any
ModelInferResponse: TypeAlias = Any

_Kind = TypeVar("_Kind", bool, int, float, str)


@overload
def scalar(values: dict[str, list], name: str, kind: type[_Kind]) -> _Kind | None: ...
@overload
def scalar(values: dict[str, list], name: str, kind: type[_Kind], default: _Kind) -> _Kind: ...
def scalar(values: dict[str, list], name: str, kind: type, default: object = None) -> object:
    """The single element of tensor `name` as `kind`, or `default` (None unless given) when the tensor is absent;
    `tensors.TensorError` for a tensor of several elements or the wrong encoding."""
    return tensors.scalar(values, name, kind, default)
