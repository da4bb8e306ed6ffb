"""Export formats by name: `available_formats`, `resolve_format`.

Adding a format is an entry in FORMAT_MODULES, its `--help` line in FORMAT_RUNTIMES (a test keeps the two tables'
names equal) and a module exposing `FORMAT` (an `ExportFormat`, export/job.py). Modules are
imported only when their format is asked for, so `python -m export --help` stays instant and a format whose module
is absent (an install without it) is simply not offered.
"""

from __future__ import annotations

import importlib
import importlib.util

from export.errors import ExportError
from export.job import ExportFormat

#: --format name -> module defining FORMAT; the CLI lists them in this order
FORMAT_MODULES: dict[str, str] = {
    "pytorch": "export.formats.pytorch",
    "vllm": "export.formats.vllm",
    "sglang": "export.formats.sglang",
    "tensorrt-llm": "export.formats.tensorrt_llm",
    "triton-repo": "export.formats.triton_repo",
    "onnx": "export.onnx",
}

#: the server or backend each format's bundle is for, one line for --help, without importing the modules (kept beside
#: FORMAT_MODULES on purpose)
FORMAT_RUNTIMES: dict[str, str] = {
    "pytorch": "DeepSpec's own worker (python -m service worker --bundle-dir DIR): manifest + draft directory",
    "vllm": "vLLM (vllm serve DIR): EAGLE-3 in the speculators layout, DFlash/DSpark in vLLM's layout",
    "sglang": "SGLang (--speculative-algorithm EAGLE3|DFLASH|DSPARK): midlayer.* EAGLE-3, DFlash/DSpark layouts",
    "tensorrt-llm": "TensorRT-LLM: checkpoint (config.json + rank{r}.safetensors), EAGLE-3 draft, "
    "trtllm-serve --config YAML and build.sh for the <=1.2 engine flow",
    "triton-repo": "Triton Inference Server: TensorRT-LLM LLM-API model repository, speculative (+ the <=1.2 "
    "engine ensemble, which decodes target-only: nothing feeds its draft_input_ids)",
    "onnx": "ONNX Runtime (python -m service worker --bundle-dir DIR)",
}


def _present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def available_formats() -> list[str]:
    return [name for name, module in FORMAT_MODULES.items() if _present(module)]


def resolve_format(name: str) -> ExportFormat:
    if name not in available_formats():
        raise ExportError(f"unknown format {name!r}; available: {', '.join(available_formats())}")
    fmt = getattr(importlib.import_module(FORMAT_MODULES[name]), "FORMAT", None)
    if fmt is None:
        raise ExportError(
            f"format {name!r} is not available in this install ({FORMAT_MODULES[name]} defines no FORMAT)"
        )
    assert fmt.name == name, f"{FORMAT_MODULES[name]}.FORMAT is named {fmt.name!r}, registered as {name!r}"
    return fmt
