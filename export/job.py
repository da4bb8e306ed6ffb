"""The contract between the CLI and a format: what to export (`ExportJob`) and how a format writes it
(`ExportFormat`), and how a draft algorithm's drafts go out for one engine (`DraftWriter`). No behaviour lives here.

A format's `write(job, out, progress)` fills the empty directory `out` (a scratch directory that the CLI renames
to `--out` once everything is written) and returns the manifest fields of its own (`engine`, `draft`, ...); the
CLI adds the common ones (export/manifest.py) and the sha256 of every file. It raises `ExportError` for input it
cannot honour before writing anything large.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from export.progress import Progress
    from export.sources import DraftSource, TargetSource


@dataclass
class ExportJob:
    target: TargetSource
    #: the --draft value as given (a drafter keyword, deepspec.decoding.registry.drafter_keywords(), or a path)
    draft_spec: str
    #: the resolved draft directory, or None for none/prompt-lookup
    draft: DraftSource | None
    #: float32 | bfloat16 | float16
    dtype: str
    #: tensor-parallel ranks (TensorRT-LLM checkpoint shards, engine tensor_parallel_size)
    tp: int = 1
    #: draft tokens per verify step written into the launch snippets
    num_speculative_tokens: int = 3
    #: run the engine build where its toolchain is present (tensorrt-llm)
    build: bool = False
    #: anything a format wants from the command line that the others do not
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ExportFormat:
    #: the --format value
    name: str
    #: the server or backend that loads the bundle, one line (for --help, the manifest and the README)
    runtime: str
    #: write(job, out, progress) -> manifest fields of this format
    write: Callable[[ExportJob, Path, Progress], dict]
    #: dtypes this format can write; the first is the default
    dtypes: tuple[str, ...] = ("bfloat16", "float16", "float32")
    #: check(job): raise ExportError for input this format refuses; runs before anything is written
    check: Callable[[ExportJob], None] | None = None
    #: True when the format needs a trained neural draft (eagle3 / dflash / dspark) rather than a worker drafter
    needs_neural_draft: bool = True
    #: True when DeepSpec's worker serves the output: `--draft auto` then ranks the shipped drafts as the worker's
    #: own `--draft auto` does (not measured slower than target-only) and falls back to prompt lookup
    serves_in_worker: bool = False
    #: target families this format takes (deepspec.models.arch family names)
    families: tuple[str, ...] = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")


@dataclass(frozen=True)
class DraftWriter:
    """How one engine loads one draft algorithm: the algorithm's record (deepspec/algorithms) maps each engine that
    loads it to one of these (`export_writers`); export/drafts/writers.py runs it."""

    #: the engine's own name of the algorithm: vLLM's speculative `method`, SGLang's `--speculative-algorithm`,
    #: TensorRT-LLM's `decoding_type`
    engine_name: str
    #: check(engine, job): raise ExportError naming every reason the engine cannot load job.draft; runs before any write
    check: Callable[[str, ExportJob], None]
    #: convert(engine, job, dtype) -> (tensors, config.json, the captured layers in the engine's own numbering)
    convert: Callable[[str, ExportJob, torch.dtype], tuple[dict, dict, list[int]]]
    #: speculative_options(job) -> keys the engine's speculative config needs beyond name, draft and length
    speculative_options: Callable[[ExportJob], dict] | None = None
    #: the draft directory names its target (vLLM's speculators format), so the engine serves both from it alone
    names_its_target: bool = False
