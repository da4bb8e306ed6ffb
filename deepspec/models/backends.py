"""Inference backends: the ways a target's forward runs, one `InferenceBackend` record per backend, looked up by name
as draft algorithms are (deepspec/algorithms). The names are spelled here only; the worker's, the training CLI's and
the benchmarks' `--backend` choices, the settings' validation and the loaders all read this table.

    from deepspec.models.backends import resolve_backend

    backend = resolve_backend("native")              # KeyError naming the registered ones
    reason = backend.unavailable("cpu")              # None where it can run, else why not (one line)
    target = backend.load("smollm2-135m", weights="auto")

- `pytorch`: the PyTorch decoder (bf16/fp32, a GGUF target's own 4-bit weights on torch's int4 kernel), on CPU or
  CUDA; it also opens a bundle `python -m export` wrote (deepspec/models/target_loader.py).
- `onnx`: ONNX Runtime on an exported onnx bundle (int8 or int4 weights), CPU only.
- `native`: the native CPU decoder (deepspec/models/native), compiled for this CPU on first use.
- `auto` (a choice, not a backend): the one measured fastest on this machine (service/worker/fastest_backend.py).

Each record says which values of the one weight-format option (deepspec/models/quantization.py WEIGHT_FORMATS)
apply to it, so a value that does not is refused instead of ignored, and `auto` weighs only the backends that
honour the value given (`backends_honouring`). Torch-free at import: command lines read the
choices before anything loads.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from deepspec.models.quantization import WEIGHT_FORMATS

PYTORCH, ONNX, NATIVE = "pytorch", "onnx", "native"
#: the `--backend` value that lets the worker measure which backend runs fastest here
AUTO = "auto"


@dataclass(frozen=True)
class InferenceBackend:
    """Everything needed to offer, check and load one backend, looked up by `name`."""

    #: the --backend value
    name: str
    #: one line for --help
    description: str
    #: unavailable(device) -> None where the backend can run on `device`, else why not (one line, with the fix)
    unavailable: Callable[[str], str | None]
    #: load(spec, *, weights, dtype, device, chat_template, max_seq_len, for_chat) -> a Target
    load: Callable[..., object]
    #: the WEIGHT_FORMATS values this backend honours ("auto" always: the backend's own choice)
    weight_formats: tuple[str, ...] = (AUTO,)

    def check_weight_format(self, weights: str) -> None:
        """ValueError naming the values that apply when `weights` does not apply to this backend."""
        if weights not in WEIGHT_FORMATS:
            raise ValueError(f"unknown weight format {weights!r}; choose one of {', '.join(WEIGHT_FORMATS)}")
        if weights not in self.weight_formats:
            raise ValueError(
                f"weight format {weights!r} does not apply to the {self.name} backend: it takes "
                f"{', '.join(self.weight_formats)}"
            )


def _cpu_only(device: str) -> str | None:
    return None if device == "cpu" else f"it runs on CPU only (--device {device})"


def _pytorch_unavailable(device: str) -> str | None:
    if not device.startswith("cuda"):
        return None
    import torch

    return None if torch.cuda.is_available() else "no CUDA GPU is visible to torch (use --device cpu)"


def _onnx_unavailable(device: str) -> str | None:
    if importlib.util.find_spec("onnxruntime") is None:
        return "onnxruntime is not installed (pip install 'deepspec[export]')"
    return _cpu_only(device)


def _native_unavailable(device: str) -> str | None:
    """Why the native decoder cannot run here, or None (building it for this CPU if it is not built yet)."""
    if reason := _cpu_only(device):
        return reason
    from deepspec.models.native import NativeUnavailable
    from deepspec.models.native.build import load_library

    try:
        load_library()
    except NativeUnavailable as e:
        return str(e).splitlines()[0]
    return None


def _load_pytorch(
    spec: str,
    *,
    weights: str = AUTO,
    dtype: str = "bfloat16",
    device: str = "cpu",
    chat_template: str | None = None,
    max_seq_len: int | None = None,
    for_chat: bool = False,
):
    from deepspec.models.target_loader import load_target

    return load_target(
        spec,
        dtype=dtype,
        device=device,
        quantization=weights,
        chat_template=chat_template,
        max_seq_len=max_seq_len,
        for_chat=for_chat,
    )


def _load_onnx(
    spec: str,
    *,
    weights: str = AUTO,
    dtype: str = "float32",
    device: str = "cpu",
    chat_template: str | None = None,
    max_seq_len: int | None = None,
    for_chat: bool = False,
):
    """An onnx bundle as exported: its weight format was chosen at export time (`weights` auto, or the same)."""
    from deepspec.models.onnx_target import is_onnx_export
    from deepspec.models.target_loader import load_target

    if not is_onnx_export(spec):
        raise ValueError(f"the onnx backend runs an onnx bundle (python -m export --format onnx); {spec!r} is none")
    exported = json.loads((Path(spec) / "onnx.json").read_text()).get("quantization")
    if weights not in (AUTO, exported):
        raise ValueError(
            f"the onnx bundle {spec} holds {exported} weights, not {weights}: export it again with "
            f"--quantization {weights}"
        )
    return load_target(spec, chat_template=chat_template, max_seq_len=max_seq_len, for_chat=for_chat)


#: the one weight-format option's values in the native decoder's own names
_NATIVE_WEIGHTS = {AUTO: "auto", "int8": "int8", "int4": "q4"}


def _load_native(
    spec: str,
    *,
    weights: str = AUTO,
    dtype: str = "float32",
    device: str = "cpu",
    chat_template: str | None = None,
    max_seq_len: int | None = None,
    for_chat: bool = False,
):
    """The native decoder computes in its own formats whatever `dtype` says: auto = a GGUF Q4_1 target's 4-bit
    blocks as shipped, int8 for a float one (deepspec/models/native/target.py layer_weights)."""
    from deepspec.models.native import load_native_target

    return load_native_target(
        spec, max_seq_len=max_seq_len, chat_template=chat_template, for_chat=for_chat, weights=_NATIVE_WEIGHTS[weights]
    )


_BACKENDS: dict[str, InferenceBackend] = {}


def register_backend(backend: InferenceBackend) -> None:
    if backend.name in _BACKENDS or backend.name == AUTO:
        raise ValueError(f"inference backend '{backend.name}' is already registered")
    _BACKENDS[backend.name] = backend


def available_backends() -> list[str]:
    """The registered backends' names, in registration order (the built-ins: pytorch, onnx, native)."""
    return list(_BACKENDS)


def backend_choices(without: tuple[str, ...] = ()) -> tuple[str, ...]:
    """What a `--backend` flag offers: every backend but those `without` (a stage that has no use for them), then
    auto."""
    return (*(name for name in _BACKENDS if name not in without), AUTO)


def backends_honouring(weights: str) -> tuple[str, ...]:
    """The registered backends that honour weight format `weights`, in registration order: every one for auto,
    those whose `weight_formats` name it otherwise (what `--backend auto --quantization X` weighs)."""
    return tuple(name for name, backend in _BACKENDS.items() if weights in backend.weight_formats)


def resolve_backend(name: str) -> InferenceBackend:
    try:
        return _BACKENDS[name]
    except KeyError:
        raise KeyError(f"unknown inference backend '{name}'; available: {available_backends()} or {AUTO}") from None


def check_backend_choice(name: str) -> str:
    """`name` when it is a backend or auto, else ValueError listing the choices (settings validators call this)."""
    if name != AUTO and name not in _BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(backend_choices())}")
    return name


for _backend in (
    InferenceBackend(
        PYTORCH,
        "the PyTorch decoder (bf16/fp32; a GGUF target's own 4-bit weights)",
        _pytorch_unavailable,
        _load_pytorch,
        weight_formats=(AUTO, "none", "gguf"),
    ),
    InferenceBackend(
        ONNX,
        "ONNX Runtime on an exported onnx bundle (int8 / int4 weights), CPU",
        _onnx_unavailable,
        _load_onnx,
        weight_formats=(AUTO, "none", "int8", "int4"),
    ),
    InferenceBackend(
        NATIVE,
        "the native CPU decoder (a GGUF's 4-bit blocks, else int8), compiled on first use",
        _native_unavailable,
        _load_native,
        weight_formats=(AUTO, "int8", "int4"),
    ),
):
    register_backend(_backend)
