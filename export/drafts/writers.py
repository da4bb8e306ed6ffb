"""Write a draft directory in one engine's dialect: config.json + model.safetensors (+ what the engine reads beside).

Which engines load an algorithm, and how, is the algorithm's record (deepspec/algorithms: `export_writers`, engine ->
`DraftWriter`, export/job.py): Eagle3's in drafts/eagle3.py, DFlash's and DSpark's in drafts/block.py.
`write_draft(engine, job, dest)` returns the manifest fields it settles (`engine_layer_ids`, the config the launch
snippets need). Refusals happen in `check_draft`, which every format runs before writing anything.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from deepspec.algorithms import load_part, resolve_algorithm
from export.errors import ExportError
from export.job import DraftWriter, ExportJob
from export.sources import DraftSource

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def exported_draft(job: ExportJob) -> DraftSource:
    """The draft a draft-only format writes (export/resolve.py refuses such a format without one first)."""
    if job.draft is None:
        raise ExportError(f"--draft {job.draft_spec} leaves no draft to export; pass a draft directory")
    return job.draft


def draft_writer(engine: str, draft) -> DraftWriter:
    """The writer of `engine` for this neural draft's algorithm; ExportError naming the engines that take it."""
    writers = resolve_algorithm(draft.algo).export_writers
    if engine not in writers:
        where = ", ".join(writers) if writers else "no other engine (only DeepSpec's worker: --format pytorch)"
        raise ExportError(f"{engine} cannot load {draft.path.name}: DeepSpec exports {draft.algo} drafts for {where}")
    return load_part(writers[engine])


def check_draft(engine: str, job) -> None:
    draft = job.draft
    if draft is None:
        return
    if not draft.is_neural:
        raise ExportError(
            f"{engine} cannot load {draft.path.name}: {draft.kind} runs only in DeepSpec's worker (--format pytorch)"
        )
    draft_writer(engine, draft).check(engine, job)


def write_draft_dir(engine: str, job, out: Path, progress) -> dict:
    """The draft-only formats' one step: `write_draft` into out/draft under its progress bar."""
    with progress.task(f"{engine} draft", total=1) as advance:
        fields = write_draft(engine, job, out / "draft")
        advance(1)
    return fields


def write_draft(engine: str, job, dest: Path) -> dict:
    from safetensors.torch import save_file

    tensors, config, layer_ids = draft_writer(engine, job.draft).convert(engine, job, DTYPES[job.dtype])
    dest.mkdir(parents=True)
    save_file(tensors, dest / "model.safetensors", metadata={"format": "pt"})
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return {"engine_layer_ids": {engine: layer_ids}, "draft_config": config}
