"""`python -m export`: a target and a trained draft -> a directory the chosen engine serves.

Deliberately limited to parsing flags, resolving the inputs and the write-then-rename lifecycle; each format's
work lives in export/formats/ (registry: export/registry.py). Bad input is one line on stderr and exit code 2, and
nothing is left behind.

    python -m export --format pytorch --out engines/cpu                         # default target + best shipped draft
    python -m export --draft drafts/smollm2-135m-eagle3 --format vllm --out engines/vllm
    python -m export --draft drafts/my-eagle3 --format sglang --out engines/sglang
    python -m export --target ./Qwen3-8B --draft drafts/qwen3-8b-eagle3 --format tensorrt-llm --tp 2 --out engines/trt
    python -m export --target ./Qwen3-8B --draft drafts/qwen3-8b-eagle3 --format triton-repo --out engines/triton
    python -m export --format onnx --quantization int4 --out engines/onnx    # ONNX Runtime graph, 4-bit weights
    python -m export --format onnx --quantization auto --out engines/onnx    # the weight format fastest on this CPU
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from deepspec.models.chat_templates import BUILTIN_CHAT_TEMPLATES
from export.errors import ExportError
from export.registry import FORMAT_ENGINES, FORMAT_MODULES

DTYPES = ("bfloat16", "float16", "float32")


def build_parser() -> argparse.ArgumentParser:
    formats = "\n".join(f"  {name:<13} {engine}" for name, engine in FORMAT_ENGINES.items())
    p = argparse.ArgumentParser(
        prog="python -m export", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Export a target and its trained draft for a serving engine. Every output directory carries "
                    "manifest.json (what it was made from, every file's sha256).",
        epilog=f"formats (--format) and the engine each is for:\n{formats}\n\n"
               "Layer ids, tensor names and what each engine refuses: export/DESIGN.md.")
    g = p.add_argument_group("what to export")
    g.add_argument("--target", default="smollm2-135m",
                   help="target: an alias (smollm2-135m, gemma3-270m), a Hugging Face directory or a .gguf file "
                        "(default smollm2-135m)")
    g.add_argument("--draft", default="auto",
                   help="draft directory from python -m training; 'auto' = the best shipped draft for the target "
                        "that the format can take (default); 'none' = target only; 'prompt-lookup' (pytorch only)")
    g.add_argument("--format", required=True, metavar="FORMAT",
                   help=f"one of: {', '.join(FORMAT_MODULES)} (see below)")
    g.add_argument("--chat-template", default=None, metavar="NAME|FILE",
                   help=f"chat template the export's tokenizer carries, for a target that ships none (gemma3-270m): "
                        f"a built-in ({', '.join(BUILTIN_CHAT_TEMPLATES)}) or a Jinja file (default: the target's own)")
    g = p.add_argument_group("output")
    g.add_argument("--out", required=True, type=Path,
                   help="output directory; written beside it under a scratch name and renamed at the end")
    g.add_argument("--force", action="store_true", help="replace an existing, non-empty --out")
    g.add_argument("--dtype", choices=DTYPES, default=None,
                   help="weights dtype written (default: bfloat16; pytorch: the worker loads float32 or bfloat16)")
    g = p.add_argument_group("engine settings")
    g.add_argument("--tp", type=int, default=1,
                   help="tensor-parallel ranks: one rank{r}.safetensors each (tensorrt-llm), tensor_parallel_size "
                        "in launch snippets (default 1)")
    g.add_argument("--num-speculative-tokens", type=int, default=3,
                   help="draft tokens per verify step written into the launch snippets (default 3; 1-16)")
    g.add_argument("--quantization", choices=("none", "int4", "int8", "auto"), default="none",
                   help="onnx: matmul weights as float32 (none, default), 4-bit blocks of 32 run by ONNX Runtime's "
                        "MatMulNBits (int4: ~3x smaller, faster batch-1 decode on CPU), int8 per channel run by "
                        "MatMulIntegerToFloat on activations quantized per row (int8: 2x int4's size, cheaper "
                        "multi-token verify steps), or auto: "
                        "export int8 and int4, time each one's verify steps here and keep the faster (the choice and "
                        "both curves go into onnx.json; the graph runs best on the machine that exported it)")
    g.add_argument("--build", action="store_true",
                   help="tensorrt-llm: also run build.sh (trtllm-build) here; needs tensorrt_llm and a CUDA GPU, "
                        "else exit 2 naming what is missing and the commands to run on a GPU host")
    return p


def main(argv: list[str] | None = None, progress=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.tp < 1:
        parser.error("--tp must be >= 1")
    if not 1 <= args.num_speculative_tokens <= 16:
        parser.error("--num-speculative-tokens must be in 1..16")
    if args.quantization != "none" and args.format != "onnx":
        parser.error("--quantization applies to --format onnx only")
    try:
        summary = run(args, progress)
    except ExportError as e:
        print(f"python -m export: error: {e}", file=sys.stderr)
        return 2
    print(summary)
    return 0


def run(args: argparse.Namespace, progress=None) -> str:
    """Resolve, check, write, rename; returns the closing summary line."""
    from export.manifest import write_manifest
    from export.progress import Progress
    from export.registry import resolve_format
    from export.resolve import make_job
    from export.staging import check_out, staged

    started = time.monotonic()
    fmt = resolve_format(args.format)
    check_out(args.out, args.force)
    job = make_job(fmt, args)
    job.options["final_out"] = args.out  # where the output will live once renamed (for absolute paths inside it)
    job.options["quantization"] = args.quantization
    _choose_chat_template(job, args.chat_template)
    for warning in job.options.get("warnings", []):
        print(f"python -m export: warning: {warning}", file=sys.stderr)
    progress = progress or Progress()
    with progress, staged(args.out, args.force) as scratch:
        fields = fmt.write(job, scratch, progress)
        _place_chat_template(fmt, job, scratch, fields)
        common = _common_fields(fmt, job)
        files = sum(1 for p in scratch.rglob("*") if p.is_file())
        with progress.task("sha256", total=files) as advance:
            manifest = write_manifest(scratch, {**common, **fields}, advance)
    size_mb = sum(f["bytes"] for f in manifest["files"].values()) / 1e6
    return (f"exported {fmt.name} ({manifest.get('algorithm') or 'no draft'}) to {args.out}: "
            f"{len(manifest['files'])} files, {size_mb:.1f} MB in {time.monotonic() - started:.1f} s")


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
    if fmt.name in ("vllm", "sglang", "pytorch"):  # the launch commands / the worker's --engine-dir take it
        return
    warning = (f"--chat-template: format {fmt.name} points its engine at the tokenizer in {job.target.path}; the "
               f"template is in OUT/{CHAT_TEMPLATE_FILE}: give it to the engine's chat-template option")
    job.options.setdefault("warnings", []).append(warning)
    print(f"python -m export: warning: {warning}", file=sys.stderr)


def _common_fields(fmt, job) -> dict:
    from export.layer_ids import hs_from_feature_layers

    draft = job.draft
    fields = {
        "format": fmt.name,
        "engine": fmt.engine,
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
