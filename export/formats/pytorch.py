"""`--format pytorch`: what DeepSpec's worker runs (`python -m service worker --bundle-dir DIR`).

The output is the manifest plus a copy of the draft directory (`draft/`; a hybrid's two parts inside it, see
export/drafts/copy.py), so the bundle is pinned and self-contained: the worker reads target, draft and dtype from
manifest.json (service/worker/bundle.py). The target stays a reference (alias or absolute path): the worker loads
it, dequantizing an alias's GGUF once into its cache. No GPU, no conversion: this is the chart's default export on CPU.
"""

from __future__ import annotations

from pathlib import Path

from export.drafts.copy import copy_draft
from export.job import ExportFormat, ExportJob

WORKER_DTYPES = ("bfloat16", "float32")


def write(job: ExportJob, out: Path, progress) -> dict:
    fields = {"launch": {"deepspec": "python -m service worker --bundle-dir DIR"}}
    if job.draft is None:
        return {**fields, "draft": job.draft_spec}
    copy_draft(job.draft, out / "draft", progress)
    return {**fields, "draft": "draft"}


FORMAT = ExportFormat(
    name="pytorch",
    runtime="DeepSpec worker (python -m service worker --bundle-dir DIR), CPU or CUDA",
    write=write,
    dtypes=WORKER_DTYPES,
    needs_neural_draft=False,
    serves_in_worker=True,
)
