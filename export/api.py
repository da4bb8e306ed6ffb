"""export as a library: what another stage calls instead of running `python -m export` with an argv list.

The worker (service/worker/fastest_backend.py) exports the ONNX bundle it serves on its first start and measures the
bundles it could serve; it reaches export only through this module (tests/deepspec/test_layering.py holds it to
that). `export_bundle` runs the same resolve, check, write-then-rename lifecycle as the CLI, which is a thin parser
over it (export/cli.py): typed arguments in, an `ExportResult` out, `ExportError` for input it cannot honour, and
nothing left behind on failure.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from deepspec.models.backends import ONNX, resolve_backend
from deepspec.models.quantization import WEIGHT_FORMATS
from export.errors import ExportError

__all__ = [
    "ExportError",
    "ExportRequest",
    "ExportResult",
    "export_bundle",
    "exported_draft_dir",
    "measure_served_rates",
    "onnx_unsupported_reason",
    "served_drafter",
]

#: the dtypes a bundle's weights may be written in
DTYPES = ("bfloat16", "float16", "float32")
#: the values of --quantization that each format honours, out of the one weight-format option the worker takes too
#: (deepspec/models/quantization.py WEIGHT_FORMATS): an onnx bundle takes what the onnx backend runs, every other
#: format writes dense weights in --dtype ("none") and refuses the rest
FORMAT_WEIGHT_FORMATS = {"onnx": resolve_backend(ONNX).weight_formats}


@dataclass(frozen=True)
class ExportRequest:
    """One export: the CLI's flags as typed fields (their help is `python -m export --help`)."""

    #: the format (export/registry.py FORMAT_MODULES): which server or backend loads the bundle
    format: str
    #: the bundle's folder; written beside it under a scratch name and renamed at the end
    out: Path
    #: an alias, a Hugging Face directory or a .gguf file
    target: str = "smollm2-135m"
    #: a draft directory, "auto" (the best shipped draft the format takes), "none" or "prompt-lookup"
    draft: str = "auto"
    #: a built-in chat template name or a Jinja file; None = the target's own
    chat_template: str | None = None
    #: one of DTYPES; None = the format's default
    dtype: str | None = None
    #: tensor-parallel ranks (tensorrt-llm shards, launch snippets)
    tp: int = 1
    #: draft tokens per verify step written into the launch snippets
    num_speculative_tokens: int = 3
    #: the weight format (WEIGHT_FORMATS); None = the format's own (dense weights in `dtype`). An onnx bundle takes
    #: none, int8, int4 or auto (the faster here, measured); the other formats "none" only
    quantization: str | None = None
    #: tensorrt-llm: also run build.sh here
    build: bool = False
    #: replace an existing, non-empty `out`
    force: bool = False

    def __post_init__(self):
        object.__setattr__(self, "out", Path(self.out))
        if self.tp < 1:
            raise ExportError("--tp must be >= 1")
        if not 1 <= self.num_speculative_tokens <= 16:
            raise ExportError("--num-speculative-tokens must be in 1..16")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ExportError(f"--dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}")
        if self.quantization is None:
            return
        if self.quantization not in WEIGHT_FORMATS:
            raise ExportError(f"--quantization must be one of {', '.join(WEIGHT_FORMATS)}, not {self.quantization!r}")
        takes = FORMAT_WEIGHT_FORMATS.get(self.format, ("none",))
        if self.quantization not in takes:
            raise ExportError(
                f"--quantization {self.quantization} does not apply to --format {self.format}: it takes "
                f"{', '.join(takes)}"
            )


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote: its folder and its manifest.json (what it was made from, every file's sha256)."""

    out: Path
    manifest: dict
    seconds: float

    def summary(self, format_name: str) -> str:
        size_mb = sum(f["bytes"] for f in self.manifest["files"].values()) / 1e6
        return (
            f"exported {format_name} ({self.manifest.get('algorithm') or 'no draft'}) to {self.out}: "
            f"{len(self.manifest['files'])} files, {size_mb:.1f} MB in {self.seconds:.1f} s"
        )


def export_bundle(request: ExportRequest, progress=None) -> ExportResult:
    """Resolve, check, write and rename one bundle; `progress` an export.progress.Progress (default: bars on a
    terminal, nothing otherwise). Raises ExportError before anything large is written; warnings go to stderr."""
    from export.manifest import write_manifest
    from export.progress import Progress
    from export.registry import resolve_format
    from export.resolve import make_job
    from export.staging import check_out, staged

    started = time.monotonic()
    fmt = resolve_format(request.format)
    check_out(request.out, request.force)
    job = make_job(fmt, request)
    job.options["final_out"] = request.out  # where the output will live once renamed (for absolute paths inside it)
    job.options["quantization"] = request.quantization or "none"
    _choose_chat_template(job, request.chat_template)
    for warning in job.options.get("warnings", []):
        print(f"python -m export: warning: {warning}", file=sys.stderr)
    progress = progress or Progress()
    with progress, staged(request.out, request.force) as scratch:
        fields = fmt.write(job, scratch, progress)
        _place_chat_template(fmt, job, scratch, fields)
        common = _common_fields(fmt, job)
        files = sum(1 for p in scratch.rglob("*") if p.is_file())
        with progress.task("sha256", total=files) as advance:
            manifest = write_manifest(scratch, {**common, **fields}, advance)
    return ExportResult(request.out, manifest, time.monotonic() - started)


def _choose_chat_template(job, value: str | None) -> None:
    """--chat-template -> job.options["chat_template"] (the text the writers put beside the tokenizer files they
    copy), refused before anything is written when it is neither a built-in nor a file. Without it, a target that
    ships no template still exports (completions need none) with the refusal's own line as a warning: the engine
    will refuse chat requests until it has one."""
    from deepspec.models.chat_templates import MissingChatTemplateError, require_chat_template, resolve_chat_template

    if value is not None:
        try:
            job.options["chat_template"] = resolve_chat_template(value)
        except ValueError as e:
            raise ExportError(str(e)) from None
        return
    try:
        require_chat_template(job.target.tokenizer, job.target.spec, job.target.family)
    except MissingChatTemplateError as e:
        job.options.setdefault("warnings", []).append(f"{e}; until then its engine refuses chat requests")


def _place_chat_template(fmt, job, scratch: Path, fields: dict) -> None:
    """A format that copies the target's tokenizer files puts the chosen template into them and names the file in
    its fields (`chat_template`). The others point their engine at the target's own directory: the template goes
    beside manifest.json, and a warning says the engine must be given it."""
    from deepspec.models.chat_templates import CHAT_TEMPLATE_FILE

    template = job.options.get("chat_template")
    if template is None or "chat_template" in fields:
        return
    (scratch / CHAT_TEMPLATE_FILE).write_text(template, encoding="utf-8")
    fields["chat_template"] = CHAT_TEMPLATE_FILE
    if fmt.name in ("vllm", "sglang", "pytorch"):  # the launch commands / the worker's --bundle-dir take it
        return
    warning = (
        f"--chat-template: format {fmt.name} points its engine at the tokenizer in {job.target.path}; the "
        f"template is in OUT/{CHAT_TEMPLATE_FILE}: give it to the engine's chat-template option"
    )
    job.options.setdefault("warnings", []).append(warning)
    print(f"python -m export: warning: {warning}", file=sys.stderr)


def _common_fields(fmt, job) -> dict:
    from export.layer_ids import hs_from_feature_layers

    draft = job.draft
    fields = {
        "format": fmt.name,
        "runtime": fmt.runtime,
        "target": job.target.spec if job.target.is_alias else str(Path(job.target.spec).resolve()),
        "target_fingerprint": job.target.fingerprint(),
        "draft": job.draft_spec,
        "draft_source": str(draft.path.resolve()) if draft else job.draft_spec,
        "algorithm": draft.algo if draft else None,
        "dtype": job.dtype,
        "captured_layers_hs": list(hs_from_feature_layers(draft.cfg.feature_layers)) if draft and draft.cfg else [],
    }
    if job.options.get("warnings"):
        fields["warnings"] = job.options["warnings"]
    return fields


def onnx_unsupported_reason(target: str) -> str | None:
    """Why the ONNX graph cannot describe `target` (an alias, directory or .gguf), or None when it can."""
    from export.onnx.graph import UnsupportedTarget, check_supported
    from export.sources import open_target

    try:
        check_supported(open_target(target).arch)
    except (UnsupportedTarget, ExportError) as e:
        return str(e)
    return None


def exported_draft_dir(bundle: Path, meta: dict) -> Path | None:
    """The draft directory an onnx bundle holds (its onnx.json `meta` names it), or None: no draft, or a drafter
    named by keyword (prompt lookup)."""
    from export.onnx.exporter import exported_draft_dir as draft_dir

    return draft_dir(bundle, meta)


def served_drafter(target):
    """The drafter the worker serves a loaded onnx bundle `target` with, or None (export/onnx/decode_rate.py)."""
    from export.onnx.decode_rate import served_drafter as drafter

    return drafter(target)


def measure_served_rates(candidates: dict[str, tuple], depth: int) -> dict[str, dict] | None:
    """Each {name: (target, drafter or None)} decoding the calibration prompts at batch 1, as the worker would serve
    it: {name: {"tokens_per_second": ...}}, or None without calibration prompts (export/onnx/decode_rate.py)."""
    from export.onnx.decode_rate import measure_served_rates as measure

    return measure(candidates, depth)
