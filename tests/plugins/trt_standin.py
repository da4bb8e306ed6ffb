"""TensorRT's real Python plugin frontend on a machine without CUDA: a stand-in for its C extension only.

The `tensorrt-cu13-bindings` wheel (the `test` extra) ships `tensorrt_bindings/plugin/`, the pure-Python package
that TensorRT serves as `tensorrt.plugin`: the `register` / `aot_impl` / `impl` / `autotune` decorators, the
signature validation they run (`_validate.py`), the shape-expression classes and the plugin classes TensorRT's
builder calls (`_plugin_class.py`). Everything it needs from the C extension (`tensorrt.so`, which cannot load
without the CUDA and TensorRT libraries) is below: enums, the interface base classes it subclasses, a plugin
registry, and dimension expressions. Those expressions carry their value, so a shape function or an `aot_impl`
evaluates to numbers a test can check; TensorRT's own are symbolic, built by the same builder calls.

`build_aot()` then asks a registered plugin what TensorRT's builder asks an ahead-of-time plugin, in its order: the
plugin from its creator (strictly AOT), output dtypes, output shapes, a tactic, launch parameters and the kernel.

`tensorrt_plugin()` puts this module in `sys.modules` as `tensorrt` with the wheel's folder as its package path,
so `import tensorrt.plugin` loads the wheel's real package, as `plugins/tensorrt.py` imports it. It restores
`sys.modules` on exit: the next import of `plugins.tensorrt` meets the real (absent) TensorRT again.
"""

from __future__ import annotations

import enum
import importlib
import importlib.util
import operator
import sys
import types
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

WHEEL = "tensorrt-cu13-bindings"


class DataType(enum.Enum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    UINT8 = 5
    FP8 = 6
    BF16 = 7
    INT64 = 8
    INT4 = 9
    FP4 = 10


class PluginFieldType(enum.Enum):
    FLOAT16 = 0
    FLOAT32 = 1
    FLOAT64 = 2
    INT8 = 3
    INT16 = 4
    INT32 = 5
    CHAR = 6
    DIMS = 7
    UNKNOWN = 8
    BF16 = 9
    INT64 = 10
    FP8 = 11
    INT4 = 12
    FP4 = 13


class DimensionOperation(enum.Enum):
    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    SUB = 4
    EQUAL = 5
    LESS = 6
    FLOOR_DIV = 7
    CEIL_DIV = 8


class TensorFormat(enum.Enum):
    LINEAR = 0
    CHW2 = 1
    HWC8 = 2


class QuickPluginCreationRequest(enum.Enum):
    UNKNOWN = 0
    PREFER_JIT = 1
    PREFER_AOT = 2
    STRICT_JIT = 3
    STRICT_AOT = 4


class TensorRTPhase(enum.Enum):
    BUILD = 0
    RUNTIME = 1


class PluginArgType(enum.Enum):
    INT = 0


class PluginArgDataType(enum.Enum):
    INT8 = 0
    INT16 = 1
    INT32 = 2


#: the module-level dtype names (`trt.float32`, `trt.int64`, ...); `bool` would shadow the builtin here
DTYPE_NAMES = {
    "float32": DataType.FLOAT,
    "float16": DataType.HALF,
    "bfloat16": DataType.BF16,
    "int8": DataType.INT8,
    "int32": DataType.INT32,
    "int64": DataType.INT64,
    "uint8": DataType.UINT8,
    "bool": DataType.BOOL,
    "fp8": DataType.FP8,
    "int4": DataType.INT4,
    "fp4": DataType.FP4,
}


class Logger:
    class Severity(enum.IntEnum):
        INTERNAL_ERROR = 0
        ERROR = 1
        WARNING = 2
        INFO = 3
        VERBOSE = 4

    INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = Severity

    def __init__(self, min_severity=Severity.WARNING):
        self.min_severity = min_severity

    def log(self, severity, msg):
        pass


class _Interface:
    """The C extension's plugin interfaces: the plugin package subclasses them and calls their __init__."""

    def __init__(self):
        pass


class IPluginV3(_Interface): ...


class IPluginV3QuickCore(_Interface): ...


class IPluginV3QuickBuild(_Interface): ...


class IPluginV3QuickAOTBuild(_Interface):
    """What TensorRT's builder calls on an AOT plugin (build_aot below): declared only, the plugin package's
    plugin class (tensorrt.plugin._plugin_class) implements them."""

    output_types: list[DataType]
    get_output_data_types: Callable[[list[DataType], list[int]], list[DataType]]
    get_output_shapes: Callable[[list[DimsExprs], list, IExprBuilder], list[DimsExprs]]
    set_tactic: Callable[[int], None]
    get_launch_params: Callable[..., None]
    get_kernel: Callable[[list[PluginTensorDesc], list[PluginTensorDesc]], tuple[bytes | str, bytes]]


class IPluginV3QuickRuntime(_Interface): ...


class IPluginCreatorV3Quick(_Interface): ...


class ISymExpr(_Interface): ...


class ITensor(_Interface): ...


_EVALUATE = {
    DimensionOperation.SUM: operator.add,
    DimensionOperation.PROD: operator.mul,
    DimensionOperation.MAX: max,
    DimensionOperation.MIN: min,
    DimensionOperation.SUB: operator.sub,
    DimensionOperation.EQUAL: lambda a, b: int(a == b),
    DimensionOperation.LESS: lambda a, b: int(a < b),
    DimensionOperation.FLOOR_DIV: operator.floordiv,
    DimensionOperation.CEIL_DIV: lambda a, b: -(-a // b),
}


class IDimensionExpr:
    """A dimension expression that knows its value: `constant` says whether TensorRT would know it at build time
    (a static dimension, a literal, or arithmetic on those)."""

    def __init__(self, value: int, constant: bool):
        self.value, self.constant = int(value), constant

    def is_constant(self) -> bool:
        return self.constant

    def get_constant_value(self) -> int:
        assert self.constant, "TensorRT has no constant value for a dynamic dimension"
        return self.value

    def __repr__(self):
        return f"IDimensionExpr({self.value}{'' if self.constant else ', dynamic'})"


class IExprBuilder:
    def constant(self, value: int) -> IDimensionExpr:
        return IDimensionExpr(value, True)

    def operation(self, op: DimensionOperation, first: IDimensionExpr, second: IDimensionExpr) -> IDimensionExpr:
        return IDimensionExpr(_EVALUATE[op](first.value, second.value), first.constant and second.constant)


class DimsExprs(list):
    def __init__(self, length_or_exprs: int | list[IDimensionExpr] = 0):
        super().__init__([None] * length_or_exprs if isinstance(length_or_exprs, int) else length_or_exprs)


class Dims(list):
    MAX_DIMS = 8

    def __init__(self, shape=()):
        super().__init__([] if isinstance(shape, int) else [int(d) for d in shape])


class PluginTensorDesc:
    def __init__(self, dims=(), type=DataType.FLOAT, format=TensorFormat.LINEAR, scale=1.0):
        self.dims, self.type, self.format, self.scale = Dims(dims), type, format, scale


class DynamicPluginTensorDesc:
    """One input or output as getLaunchParams sees it: dims with -1 where the profile leaves a size open."""

    def __init__(self, desc: PluginTensorDesc, min=(), opt=(), max=()):
        self.desc, self.min, self.opt, self.max = desc, Dims(min), Dims(opt), Dims(max)


class PluginField:
    def __init__(self, name: str, data=None, type=PluginFieldType.UNKNOWN):
        self.name, self.data, self.type = name, data, type


class PluginFieldCollection(list):
    pass


class IKernelLaunchParams:
    """What getLaunchParams fills: the grid, the block and the shared memory, each an IDimensionExpr."""

    def __init__(self):
        # each set by the plugin package to its own symbolic integer, whose `.expr` is the IDimensionExpr
        self.grid_x: Any = None
        self.grid_y: Any = None
        self.grid_z: Any = None
        self.block_x: Any = None
        self.block_y: Any = None
        self.block_z: Any = None
        self.shared_mem: Any = None


class ISymExprs(list):
    """The extra kernel arguments getLaunchParams sets: `nbSymExprs`, then one symbolic integer each."""

    @property
    def nbSymExprs(self) -> int:
        return len(self)

    @nbSymExprs.setter
    def nbSymExprs(self, count: int):
        self[:] = [None] * count


class _PluginRegistry:
    def __init__(self):
        self.creators: dict[tuple[str, str, str], IPluginCreatorV3Quick] = {}

    def register_creator(self, creator, namespace: str) -> bool:
        self.creators[(creator.name, creator.plugin_version, namespace)] = creator
        return True

    def get_creator(self, name: str, version: str, namespace: str = ""):
        return self.creators.get((name, version, namespace))


#: what the stand-in `tensorrt` module holds: the C extension's names the plugin package reads
C_EXTENSION_NAMES = (
    "DataType",
    "PluginFieldType",
    "DimensionOperation",
    "TensorFormat",
    "QuickPluginCreationRequest",
    "TensorRTPhase",
    "PluginArgType",
    "PluginArgDataType",
    "Logger",
    "IPluginV3",
    "IPluginV3QuickCore",
    "IPluginV3QuickBuild",
    "IPluginV3QuickAOTBuild",
    "IPluginV3QuickRuntime",
    "IPluginCreatorV3Quick",
    "ISymExpr",
    "ITensor",
    "IDimensionExpr",
    "IExprBuilder",
    "DimsExprs",
    "Dims",
    "PluginTensorDesc",
    "DynamicPluginTensorDesc",
    "PluginField",
    "PluginFieldCollection",
)


def _standin(package_path: list[str]) -> types.ModuleType:
    module = types.ModuleType("tensorrt", __doc__)
    module.__dict__.update({name: globals()[name] for name in C_EXTENSION_NAMES}, **DTYPE_NAMES)
    registry = _PluginRegistry()
    module.__dict__.update(get_plugin_registry=lambda: registry, __version__="10.14.1.48")
    module.__path__ = package_path
    return module


@contextmanager
def tensorrt_plugin():
    """→ (`tensorrt` stand-in, the wheel's real `tensorrt.plugin`) while the block runs; `plugins.tensorrt` may be
    imported inside it and is dropped again on exit."""
    spec = importlib.util.find_spec("tensorrt_bindings")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"TensorRT's Python plugin package comes with the {WHEEL} wheel, which is not installed: "
            "pip install -e '.[test]' (make test does)"
        )
    import plugins

    def ours(name: str) -> bool:
        return name.split(".")[0] == "tensorrt" or name == "plugins.tensorrt"

    saved = {k: v for k, v in sys.modules.items() if ours(k)}
    saved_attribute = plugins.__dict__.pop("tensorrt", None)
    for name in saved:
        del sys.modules[name]
    sys.modules["tensorrt"] = _standin(list(spec.submodule_search_locations))
    try:
        yield sys.modules["tensorrt"], importlib.import_module("tensorrt.plugin")
    finally:
        for name in [k for k in sys.modules if ours(k)]:
            del sys.modules[name]
        sys.modules.update(saved)
        plugins.__dict__.pop("tensorrt", None)
        if saved_attribute is not None:
            plugins.__dict__["tensorrt"] = saved_attribute


@dataclass(frozen=True)
class TensorIn:
    """One plugin input as the network gives it: its (opt) shape, its dtype, and which dimensions the optimization
    profile leaves dynamic, with their upper bounds in `max_shape`."""

    shape: tuple[int, ...]
    dtype: DataType
    dynamic: tuple[int, ...] = ()
    max_shape: tuple[int, ...] | None = None


@dataclass
class BuiltPlugin:
    """What the builder took from a plugin, every expression evaluated."""

    output_dtypes: list
    output_shapes: list[tuple[int, ...]]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    scalars: list[int]
    scalar_types: list = field(default_factory=list)
    kernel_name: bytes | str = b""
    ptx: bytes = b""


def _field(name: str, value) -> PluginField:
    """A node attribute as TensorRT's ONNX parser hands it to a plugin creator: a one-element array (ONNX keeps
    an INT attribute as int64, a FLOAT one as float32)."""
    if isinstance(value, float):
        return PluginField(name, np.array([value], np.float32), PluginFieldType.FLOAT32)
    return PluginField(name, np.array([value], np.int64), PluginFieldType.INT64)


def build_aot(
    trt: types.ModuleType, plugin_id: str, inputs: list[TensorIn], attrs: dict, tactic: int = 0
) -> BuiltPlugin:
    namespace, name = plugin_id.split("::")
    creator = trt.get_plugin_registry().get_creator(name, "1", namespace)
    assert creator is not None, f"{plugin_id} is not in TensorRT's plugin registry"
    fields = PluginFieldCollection(_field(k, v) for k, v in attrs.items())
    plugin = creator.create_plugin(name, namespace, fields, TensorRTPhase.BUILD, QuickPluginCreationRequest.STRICT_AOT)
    assert isinstance(plugin, IPluginV3QuickAOTBuild), f"{plugin_id}: TensorRT made a JIT plugin, not an AOT one"

    output_dtypes = plugin.get_output_data_types([t.dtype for t in inputs], [len(t.shape) for t in inputs])
    builder = IExprBuilder()
    in_exprs = [DimsExprs([IDimensionExpr(d, i not in t.dynamic) for i, d in enumerate(t.shape)]) for t in inputs]
    out_exprs = plugin.get_output_shapes(in_exprs, [], builder)
    output_shapes = [tuple(e.value for e in exprs) for exprs in out_exprs]

    def described(shape, dtype, exprs, max_shape=None):
        dims = [-1 if not e.constant else d for d, e in zip(shape, exprs)]
        return DynamicPluginTensorDesc(PluginTensorDesc(dims, dtype), shape, shape, max_shape or shape)

    in_out = [described(t.shape, t.dtype, e, t.max_shape) for t, e in zip(inputs, in_exprs)]
    in_out += [described(s, d, e) for s, d, e in zip(output_shapes, plugin.output_types, out_exprs)]
    plugin.set_tactic(tactic)
    launch, scalars = IKernelLaunchParams(), ISymExprs()
    plugin.get_launch_params(in_exprs, in_out, len(inputs), launch, scalars, builder)
    kernel_name, ptx = plugin.get_kernel(
        [d.desc for d in in_out[: len(inputs)]], [d.desc for d in in_out[len(inputs) :]]
    )
    return BuiltPlugin(
        output_dtypes=list(output_dtypes),
        output_shapes=output_shapes,
        grid=(launch.grid_x.expr.value, launch.grid_y.expr.value, launch.grid_z.expr.value),
        block=(launch.block_x.expr.value, launch.block_y.expr.value, launch.block_z.expr.value),
        shared_mem=launch.shared_mem.expr.value,
        scalars=[s.expr.value for s in scalars],
        scalar_types=[s.dtype for s in scalars],
        kernel_name=kernel_name,
        ptx=ptx,
    )
