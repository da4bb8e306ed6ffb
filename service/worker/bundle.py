"""Read a bundle (`python -m export --out DIR`, the worker's `--bundle-dir`) into its target, draft and dtype.

`DIR/manifest.json` holds at least:

    {"format": "pytorch", "target": "smollm2-135m", "draft": "draft", "dtype": "bfloat16"}

- `format`: `pytorch` (alias `deepspec`) is what this worker runs; `onnx` it runs through ONNX Runtime (the graph
  in DIR is the target, which `load_target` opens, float32 activations; a neural draft exported with it runs
  through its graphs in DIR/draft_onnx, picked by the drafter registry: deepspec/decoding/drafters/onnx_graphs.py).
  `tensorrt-llm`, `triton-repo`, `vllm` and `sglang` are refused with the way out: they run on other runtimes (a
  TensorRT-LLM engine under a stock Triton server, a draft under vLLM or SGLang). The manifest's other fields
  (fingerprint, files with sha256, captured layers) are export/manifest.py's; this reader needs only the four below.
- `target`: an alias (`smollm2-135m`), a path relative to DIR, or an absolute path.
- `draft`: `none`, `prompt-lookup`, `auto`, or a draft checkpoint directory relative to DIR (or absolute).
- `dtype`: the weights dtype the worker loads (`float32` or `bfloat16`).

Flags given on the command line win over the manifest (`WorkerSettings` applies only fields not set otherwise).
Every problem is an `BundleError` (a ValueError) that names the file and the fix; nothing here loads weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from deepspec.decoding.registry import drafter_keywords

MANIFEST = "manifest.json"
#: formats this worker serves: the PyTorch decoder over the target and draft the manifest names
PYTORCH_FORMATS = ("pytorch", "deepspec")
#: formats this worker serves through ONNX Runtime: the target is the bundle's own graph (deepspec.models.onnx_target)
ONNX_FORMATS = ("onnx",)
#: formats other runtimes serve -> how to run them instead
OTHER_RUNTIMES = {
    "tensorrt-llm": "a TensorRT-LLM engine; run it under Triton (Helm: worker.runtime=triton)",
    "triton-repo": "a Triton model repository; serve it with tritonserver (Helm: worker.runtime=triton)",
    "vllm": "a draft for vLLM; serve it with the vllm serve command in its README.md (launch/vllm.sh)",
    "sglang": "a draft for SGLang; serve it with the launch flags in its README.md (launch/sglang.sh)",
}
DTYPES = ("float32", "bfloat16")


class BundleError(ValueError):
    pass


@dataclass(frozen=True)
class BundleManifest:
    format: str
    #: alias, or an absolute path (relative ones are resolved against the bundle)
    target: str
    #: "none", "prompt-lookup", "auto", or an absolute draft directory
    draft: str
    dtype: str
    #: the chat template the export was given (`python -m export --chat-template`), absolute; None = the target's
    chat_template: str | None = None

    def worker_fields(self) -> dict[str, str]:
        """The `WorkerSettings` fields this bundle sets (unless a flag already did)."""
        fields = {"target": self.target, "draft": self.draft, "dtype": self.dtype}
        if self.chat_template is not None:
            fields["chat_template"] = self.chat_template
        return fields


def read_bundle(bundle_dir: str | Path) -> BundleManifest:
    """Validate DIR/manifest.json and resolve its paths; raise BundleError saying what is wrong."""
    root = Path(bundle_dir)
    if not root.is_dir():
        raise BundleError(f"--bundle-dir {root}: no such directory (write one with python -m export --out {root})")
    path = root / MANIFEST
    if not path.is_file():
        raise BundleError(f"--bundle-dir {root}: no {MANIFEST} (an unfinished export? run python -m export again)")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BundleError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(manifest, dict):
        raise BundleError(f"{path}: expected a JSON object, got {type(manifest).__name__}")
    missing = [k for k in ("format", "target") if not isinstance(manifest.get(k), str) or not manifest[k]]
    if missing:
        raise BundleError(f"{path}: missing or empty {', '.join(missing)} (expected strings)")
    fmt = manifest["format"]
    if fmt in OTHER_RUNTIMES:
        raise BundleError(f"{root} holds {OTHER_RUNTIMES[fmt]}")
    if fmt not in PYTORCH_FORMATS + ONNX_FORMATS:
        known = ", ".join([*PYTORCH_FORMATS, *ONNX_FORMATS, *OTHER_RUNTIMES])
        raise BundleError(f"{path}: unknown format {fmt!r} (known: {known})")
    draft, dtype = manifest.get("draft", "none"), manifest.get("dtype", "float32")
    if not isinstance(draft, str) or not draft:
        raise BundleError(f"{path}: draft must be one of {', '.join(drafter_keywords())} or a directory, got {draft!r}")
    if dtype not in DTYPES:
        raise BundleError(f"{path}: dtype {dtype!r} is not one the worker loads ({', '.join(DTYPES)})")
    target = _resolve(root, manifest["target"], path, "target", is_path=_looks_like_path(manifest["target"]))
    if fmt in ONNX_FORMATS:  # the graph in DIR is the target; it runs float32 activations
        target, dtype = str(root.resolve()), "float32"
    draft = draft if draft in drafter_keywords() else _resolve(root, draft, path, "draft", is_path=True)
    template = manifest.get("chat_template")
    if template is not None and (not isinstance(template, str) or not template):
        raise BundleError(f"{path}: chat_template must be a file in the export, got {template!r}")
    if template is not None:
        template = _resolve(root, template, path, "chat_template", is_path=True)
    return BundleManifest(fmt, target, draft, dtype, template)


def _looks_like_path(value: str) -> bool:
    return "/" in value or value.startswith(".") or value.endswith(".gguf")


def _resolve(root: Path, value: str, manifest: Path, key: str, is_path: bool) -> str:
    """An existing path relative to the bundle (or absolute) -> absolute; else an alias (targets only)."""
    candidate = Path(value) if Path(value).is_absolute() else root / value
    if candidate.exists():
        return str(candidate.resolve())
    if is_path:
        raise BundleError(f"{manifest}: {key} {value!r} does not exist (looked for {candidate})")
    return value  # an alias such as smollm2-135m: load_target resolves it
