"""`--format onnx`: the target as an ONNX Runtime graph (fp32, or 4-bit MatMulNBits weights) plus its draft, served
by DeepSpec's worker through ONNX Runtime (`python -m service worker --bundle-dir DIR`).

    python -m export --format onnx --out bundles/onnx                       # fp32 graph + the best shipped draft
    python -m export --format onnx --quantization int4 --out bundles/onnx4  # 4-bit weights (block 32)
    python -m export --format onnx --quantization int8 --out bundles/onnx8  # int8 weights per channel
    python -m export --format onnx --quantization auto --out bundles/onnx   # whichever of int8 / int4 runs faster here

`export_onnx` (export/onnx/exporter.py) does the work and is callable without the CLI; the graph itself is
described in export/onnx/graph.py, a neural draft's graphs in export/onnx/draft_graph.py, the runtime side in
deepspec/models/onnx_target.py and deepspec/decoding/drafters/onnx_graphs.py.
"""

from __future__ import annotations

from pathlib import Path

from deepspec.models.chat_templates import CHAT_TEMPLATE_FILE
from export.errors import ExportError
from export.job import ExportFormat, ExportJob
from export.onnx.auto_quantization import AUTO_CANDIDATES, export_fastest_format
from export.onnx.exporter import QUANTIZATIONS, export_onnx
from export.onnx.graph import SUPPORTED_FAMILIES

__all__ = ["FORMAT", "QUANTIZATIONS", "export_onnx"]


def write(job: ExportJob, out: Path, progress) -> dict:
    from deepspec.models import load_target

    quantization = job.options.get("quantization") or "none"
    target = load_target(job.target.spec, dtype="float32")
    draft = str(job.draft.path) if job.draft is not None else job.draft_spec
    chat_template = job.options.get("chat_template")
    graphs = len(AUTO_CANDIDATES) if quantization == "auto" else 1
    what = (
        f"writing and timing the {' and '.join(AUTO_CANDIDATES)} graphs"
        if graphs > 1
        else f"writing the ONNX graph ({quantization})"
    )
    with progress.task(what, total=target.spec.num_layers * graphs) as advance:
        if quantization == "auto":
            meta = export_fastest_format(target, draft, out, advance, chat_template)
        else:
            meta = export_onnx(target, draft, out, "float32", quantization, advance, chat_template)
    onnx = {
        "graph": meta["graph"],
        "quantization": meta["quantization"],
        "feature_layers": meta["feature_layers"],
        "step_curve": meta["step_curve"],
    }
    if "quantization_choice" in meta:
        onnx["quantization_choice"] = meta["quantization_choice"]
    fields = {
        "draft": meta["draft"]["path"],
        "onnx": onnx,
        "launch": {"deepspec": "python -m service worker --bundle-dir DIR  (ONNX Runtime, CPU)"},
    }
    if chat_template is not None:  # the tokenizer files beside the graph carry it (export/cli.py)
        fields["chat_template"] = CHAT_TEMPLATE_FILE
    return fields


def check(job: ExportJob) -> None:
    """What the ONNX export refuses, before anything is written: a target its graph does not describe (one line,
    not a traceback from the middle of the export), and a hybrid draft."""
    from export.onnx.graph import UnsupportedTarget, check_supported
    from export.sources import HYBRID

    try:
        check_supported(job.target.arch)
    except UnsupportedTarget as e:
        raise ExportError(f"onnx cannot take {job.target.spec}: {e}") from None
    if job.draft is not None and job.draft.algo == HYBRID:
        raise ExportError(
            f"onnx cannot take {job.draft.path.name}: the ONNX export runs one draft directory beside "
            f"its graph, and {job.draft.path.name} is {job.draft.kind}; export one of its parts "
            f"(--draft {job.draft.parts['neural'].path}), or the hybrid with --format pytorch"
        )


FORMAT = ExportFormat(
    name="onnx",
    runtime="ONNX Runtime in DeepSpec's worker (python -m service worker --bundle-dir DIR), CPU",
    write=write,
    dtypes=("float32",),
    check=check,
    needs_neural_draft=False,
    serves_in_worker=True,
    families=SUPPORTED_FAMILIES,
)
