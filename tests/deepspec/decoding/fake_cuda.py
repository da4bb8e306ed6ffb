"""A CUDA device made of CPU tensors, for catching device mix-ups on a machine without a GPU.

`fake_cuda()` is a context manager under which `device="cuda"` works on a CPU-only build: a tensor created on (or
moved to) cuda is a `FakeCudaTensor`, a wrapper subclass that reports `device == cuda:0` and holds a CPU tensor with
the real values, so the code under test computes exactly what it would on the CPU (argmax, `.tolist()` and `int()`
read real numbers; FakeTensorMode cannot do that, it only tracks shapes). Every op runs on the inner CPU tensors,
after the device rules CUDA enforces have been checked; breaking one raises the RuntimeError CUDA would:

- tensors of one op share a device; a 0-dim CPU tensor may join a CUDA op as a scalar (TensorIterator's rule, as
  `FakeTensor._find_common_device` in torch/_subclasses/fake_tensor.py implements it), and nothing else may;
- `copy_` and `.to()` cross devices; the indices of `index` / `index_put_` (`x[idx]`, `x[idx] = v`) may stay on
  the CPU for a CUDA tensor, but never the other way round, and index_put_'s values live on the tensor's device
  unless they are one 0-dim element (pytorch/pytorch aten/src/ATen/native/TensorAdvancedIndexing.cpp:
  `check_indices_on_cpu_or_selfdevice`, `_index_put_impl_`);
- a generator draws only for tensors of its own device type (`torch.multinomial`, `torch.rand`, `torch.randint`,
  `exponential_`, ...): `at::check_generator` in pytorch/pytorch aten/src/ATen/core/Generator.h;
- `torch.Generator(device="cuda")` makes a `FakeCudaGenerator` (a CPU generator that says it lives on cuda:0).

A verification op (`torch.ops.deepspec.*`) on cuda runs its torch reference on the cuda tensors, as the op's CUDA
registration does without triton, so the reference's device handling is checked too. Gradients are off inside
(the engine runs under inference_mode anyway). What the fake cannot see: the Triton kernels, streams and
asynchronous execution, memory. It sees only where each tensor lives, which is what a device mix-up is about.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._C._nn import _parse_to
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")
_aten = torch.ops.aten
_RealGenerator = torch.Generator

#: ops that read one device and write another (a device-to-device copy)
_CROSS_DEVICE_OPS = {_aten.copy_.default, _aten._to_copy.default, _aten.lift_fresh.default}
#: ops whose index tensors may be CPU tensors for a CUDA `self`: (self, indices, [values, ...])
_INDEX_OPS = {
    _aten.index.Tensor,
    _aten.index_put_.default,
    _aten.index_put.default,
    _aten._index_put_impl_.default,
    _aten._unsafe_index.Tensor,
    _aten._unsafe_index_put.default,
}


class FakeCudaTensor(torch.Tensor):
    """A tensor on cuda:0 whose values live in the CPU tensor `cpu_value` (same shape, strides and dtype)."""

    cpu_value: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        assert inner.device.type == "cpu" and not isinstance(inner, FakeCudaTensor)
        return torch.Tensor._make_wrapper_subclass(
            cls,
            inner.size(),
            strides=inner.stride(),
            storage_offset=inner.storage_offset(),
            dtype=inner.dtype,
            device=CUDA,
            requires_grad=inner.requires_grad,
        )

    def __init__(self, inner: torch.Tensor):
        self.cpu_value = inner

    # PyTorch's documented opt-out for wrapper subclasses; torch's stub declares the slot as a classmethod
    __torch_function__ = torch._C._disabled_torch_function_impl  # pyright: ignore[reportAssignmentType]

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})

    # Python-level methods that never reach the dispatcher on a subclass, or that would open a CUDA device guard
    def tolist(self):
        return self.cpu_value.tolist()

    def __getitem__(self, index):
        return _getitem(self, index)

    def __setitem__(self, index, value) -> None:
        _setitem(self, index, value)

    def __repr__(self) -> str:
        return f"FakeCudaTensor({self.cpu_value!r})"


def _wrap(inner: torch.Tensor) -> FakeCudaTensor:
    """A wrapper made outside inference mode: a view of a parameter taken under inference_mode shares the
    parameter's version counter, which an inference tensor cannot."""
    if inner.is_inference() or not torch.is_inference_mode_enabled():
        return FakeCudaTensor(inner)
    with torch.inference_mode(False):
        return FakeCudaTensor(inner)


class FakeCudaGenerator(_RealGenerator):
    """What `torch.Generator(device="cuda")` makes under fake_cuda: a CPU generator that says it lives on cuda:0."""

    @property
    def device(self) -> torch.device:
        return CUDA


class _GeneratorMeta(type(_RealGenerator)):
    """Keeps `isinstance(g, torch.Generator)` true for every generator while torch.Generator is patched."""

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, _RealGenerator)


class _Generator(_RealGenerator, metaclass=_GeneratorMeta):
    """Stands in for torch.Generator under fake_cuda: `device="cuda"` gives a FakeCudaGenerator."""

    def __new__(cls, device="cpu"):
        if torch.device(device).type == "cuda":
            return FakeCudaGenerator()
        return _RealGenerator(device)


def device_of(t: torch.Tensor) -> torch.device:
    return CUDA if isinstance(t, FakeCudaTensor) else t.device


def _unwrap(x):
    return x.cpu_value if isinstance(x, FakeCudaTensor) else x


def _map(fn: Callable[[Any], Any], x: Any) -> Any:
    """fn over the leaves of an op's arguments or outputs: values, and lists / tuples / dicts of them (aten ops
    nest at most that deep; torch's pytree does the same, several times slower)."""
    kind = type(x)
    if kind is tuple:
        return tuple([_map(fn, v) for v in x])
    if kind is list:
        return [_map(fn, v) for v in x]
    if kind is dict:
        return {k: _map(fn, v) for k, v in x.items()}
    return fn(x)


def _tensors(args, kwargs) -> list[torch.Tensor]:
    found = []

    def visit(x):
        if isinstance(x, torch.Tensor):
            found.append(x)
        elif isinstance(x, (list, tuple)):
            for v in x:
                visit(v)

    visit(args)
    visit(tuple(kwargs.values()))
    return found


def _mismatch(func, a: torch.device, b: torch.device, what: str = "") -> RuntimeError:
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, {a} and "
        f"{b}! ({what or 'in'} {func})"
    )


def _is_cpu_scalar(t: torch.Tensor) -> bool:
    return device_of(t).type == "cpu" and t.dim() == 0


def common_device(func, tensors: list[torch.Tensor]) -> torch.device | None:
    """The device an op over `tensors` runs on; RuntimeError where CUDA refuses the mix (a CPU 0-dim tensor is a
    scalar and defers to the other device, as in FakeTensor._find_common_device)."""
    device, from_scalar = None, False
    for t in tensors:
        d, scalar = device_of(t), _is_cpu_scalar(t)
        if device is None or (from_scalar and not scalar):
            device, from_scalar = d, scalar
        elif d != device and not scalar:
            raise _mismatch(func, device, d)
    return device


def _check_index_op(func, args) -> torch.device:
    self_ = args[0]
    device = device_of(self_)
    for index in args[1]:
        if isinstance(index, torch.Tensor) and device_of(index) not in (device, CPU):
            raise RuntimeError(
                f"indices should be either on cpu or on the same device as the indexed tensor "
                f"({device}), got an index on {device_of(index)} ({func})"
            )
    rest = [a for a in args[2:] if isinstance(a, torch.Tensor)]
    common_device(func, [self_, *rest])
    return device


def _run(func, args, kwargs):
    """Run one aten op on the inner CPU tensors after CUDA's device rules; wrap outputs that live on cuda."""
    tensors = _tensors(args, kwargs)
    if func.namespace == "deepspec" and any(isinstance(t, FakeCudaTensor) for t in tensors):
        return _verification_op_on_device(func, args, kwargs, tensors)
    requested = kwargs.get("device")
    if func in _INDEX_OPS:
        device = _check_index_op(func, args)
    elif func in _CROSS_DEVICE_OPS:
        device = device_of(args[0])
    else:
        device = common_device(func, tensors)
    if requested is not None:
        device = torch.device(requested)
        if device.type == "cuda":
            kwargs = {**kwargs, "device": CPU}
    if device is None:
        device = CPU
    out = func(*_map(_unwrap, args), **_map(_unwrap, kwargs))
    outer_of = {id(_unwrap(t)): t for t in tensors}  # an in-place op returns its argument, not a new tensor

    def wrap(o):
        if not isinstance(o, torch.Tensor):
            return o
        if id(o) in outer_of:
            return outer_of[id(o)]
        return _wrap(o) if device.type == "cuda" else o

    return _map(wrap, out)


def _verification_op_on_device(func, args, kwargs, tensors):
    """A `torch.ops.deepspec` op on cuda: the torch reference of plugins/reference/ run on the cuda tensors
    themselves, which is the CUDA kernel registration's path without triton, so the reference's own device
    handling is checked op by op (the Triton kernels themselves need a GPU)."""
    import plugins.reference

    common_device(func, tensors)
    with _FakeCudaFunctions(), _FakeCudaOps():
        return getattr(plugins.reference, func._schema.name.split("::")[1])(*args, **kwargs)


def _index_tensors(index) -> list[torch.Tensor]:
    items = index if isinstance(index, tuple) else (index,)
    found = []
    for item in items:
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (list, tuple)):
            found.extend(t for t in item if isinstance(t, torch.Tensor))
    return found


def _check_indices(self_: torch.Tensor, index) -> None:
    device = device_of(self_)
    for t in _index_tensors(index):
        if device_of(t) not in (device, CPU):
            raise RuntimeError(
                f"indices should be either on cpu or on the same device as the indexed tensor "
                f"({device}), got an index on {device_of(t)}"
            )


def _getitem(self_: FakeCudaTensor, index):
    _check_indices(self_, index)
    return _wrap(self_.cpu_value[_map(_unwrap, index)])


def _setitem(self_: FakeCudaTensor, index, value) -> None:
    _check_indices(self_, index)
    advanced = bool(_index_tensors(index))  # index_put_: values on self's device (or a CPU scalar); else copy_
    if advanced and isinstance(value, torch.Tensor) and not _is_cpu_scalar(value) and device_of(value) != CUDA:
        raise _mismatch("index_put_", CUDA, device_of(value), "values of")
    self_.cpu_value[_map(_unwrap, index)] = _unwrap(value)


_GENERATOR_TYPES = (_RealGenerator, FakeCudaGenerator)


def _generators(args, kwargs) -> list[torch.Generator]:
    # compared by type: isinstance on torch.Generator runs a Python __instancecheck__, on every call of every op
    found = [a for a in args if type(a) in _GENERATOR_TYPES]
    if type(kwargs.get("generator")) in _GENERATOR_TYPES:
        found.append(kwargs["generator"])
    return found


def _to(self_: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """Tensor.to with its device moves done here: CPU → fake cuda wraps a copy, fake cuda → CPU unwraps one."""
    device, dtype, non_blocking, memory_format = _parse_to(*args, **kwargs)
    src = device_of(self_)
    dst = src if device is None else torch.device(device)
    if dst.type == "cuda" and dst.index is None:
        dst = CUDA
    inner = _unwrap(self_)
    kw: dict[str, Any] = {"dtype": dtype} if dtype is not None else {}
    if memory_format is not None:
        kw["memory_format"] = memory_format
    moved = inner.to(CPU, **kw)
    if src == dst:
        return self_ if moved is inner else (_wrap(moved) if dst.type == "cuda" else moved)
    if moved is inner:
        moved = moved.clone()
    return _wrap(moved) if dst.type == "cuda" else moved


#: Tensor methods that read values to the host; on a subclass they would open a CUDA device guard
_HOST_READS = {
    torch.Tensor.__int__,
    torch.Tensor.__float__,
    torch.Tensor.__bool__,
    torch.Tensor.__index__,
    torch.Tensor.__complex__,
    torch.Tensor.item,
    torch.Tensor.tolist,
}
#: Tensor methods whose Python binding opens a CUDA device guard before dispatching: run on the CPU values
_GUARDED = {
    torch.Tensor.__invert__,
    torch.Tensor.nonzero,
    torch.Tensor.split,
    torch.Tensor.new_tensor,
    torch.Tensor.new,
    torch.Tensor.resize_as_,
    torch.Tensor.contiguous,
}
#: what CUDA refuses for a cuda tensor: a numpy view of device memory
_TO_NUMPY = {torch.Tensor.numpy, torch.Tensor.__array__}
#: what the torch-function level handles itself; every other call goes straight on to the dispatcher
_INTERCEPTED = (
    _HOST_READS
    | _GUARDED
    | _TO_NUMPY
    | {
        torch.Tensor.to,
        torch.Tensor.cuda,
        torch.Tensor.cpu,
        torch.Tensor.copy_,
        torch.Tensor.__getitem__,
        torch.Tensor.__setitem__,
    }
)


def _on_cpu_values(func, args, kwargs):
    """func over the CPU values of its fake cuda arguments (devices checked first); tensors come back on cuda."""
    common_device(func, _tensors(args, kwargs))
    out = func(*_map(_unwrap, args), **_map(_unwrap, kwargs))
    return _map(lambda o: _wrap(o) if isinstance(o, torch.Tensor) else o, out)


class _FakeCudaFunctions(TorchFunctionMode):
    """Torch-function level: factories on cuda, device moves, indexing (which would open a CUDA device guard) and
    the generator rule (the dispatcher sees a fresh wrapper of each generator, this level the caller's object)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        generators = _generators(args, kwargs)
        if generators:
            self._check_generators(func, args, kwargs, generators)
        if func not in _INTERCEPTED and "device" not in kwargs:
            return func(*args, **kwargs)
        if func is torch.Tensor.to:
            return _to(*args, **kwargs)
        if func is torch.Tensor.cuda:
            return _to(args[0], CUDA)
        if func is torch.Tensor.cpu:
            return _to(args[0], CPU)
        if func in _HOST_READS and isinstance(args[0], FakeCudaTensor):  # a device-to-host read of real values
            return func(args[0].cpu_value, *args[1:], **kwargs)
        if func in _TO_NUMPY and isinstance(args[0], FakeCudaTensor):
            raise TypeError(
                f"can't convert {CUDA} device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                "to host memory first."
            )
        if func in _GUARDED and isinstance(args[0], FakeCudaTensor):
            return _on_cpu_values(func, args, kwargs)
        if func is torch.Tensor.__getitem__ and isinstance(args[0], FakeCudaTensor):
            return _getitem(*args)
        if func is torch.Tensor.__setitem__ and isinstance(args[0], FakeCudaTensor):
            return _setitem(*args)
        if func is torch.Tensor.copy_ and isinstance(args[0], FakeCudaTensor):  # copies cross devices
            args[0].cpu_value.copy_(_unwrap(args[1]), *args[2:], **kwargs)
            return args[0]
        requested = kwargs.get("device")
        if requested is not None and torch.device(requested).type == "cuda" and func is not _parse_to:
            out = func(*args, **{**kwargs, "device": CPU})
            return _map(
                lambda o: _wrap(o) if isinstance(o, torch.Tensor) and not isinstance(o, FakeCudaTensor) else o, out
            )
        return func(*args, **kwargs)

    @staticmethod
    def _check_generators(func, args, kwargs, generators: list[torch.Generator]) -> None:
        tensors = _tensors(args, kwargs)
        if kwargs.get("device") is not None:
            device = torch.device(kwargs["device"])
        elif tensors:
            device = device_of(tensors[0])
        else:
            device = CPU
        for g in generators:
            if g.device.type != device.type:
                raise RuntimeError(
                    f"Expected a '{device.type}' device type for generator but found "
                    f"'{g.device.type}' ({getattr(func, '__name__', func)})"
                )


class _FakeCudaOps(TorchDispatchMode):
    """Dispatcher level: every op on any tensor, so plain CPU tensors meeting fake cuda ones are checked too."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


@contextlib.contextmanager
def fake_cuda() -> Iterator[None]:
    """Make `cuda` a device of CPU tensors until exit (see the module docstring); not thread-safe."""
    patches = [
        (torch, "Generator", _Generator),
        (torch.cuda, "_lazy_init", lambda: None),
        (torch.cuda, "synchronize", lambda device=None: None),
    ]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    for obj, name, value in patches:
        setattr(obj, name, value)
    # nn.Module.to("cuda") must put a new Parameter around each moved tensor: `param.data = moved` would graft the
    # wrapper's TensorImpl under a plain Parameter
    overwrite = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        with torch.no_grad(), _FakeCudaFunctions(), _FakeCudaOps():  # autograd would open a CUDA device guard
            yield
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(overwrite)
        for obj, name, value in saved:
            setattr(obj, name, value)
