"""`python -m export`: a target and a trained draft -> a bundle (a folder with manifest.json) that a server or backend
loads: DeepSpec's worker, ONNX Runtime, vLLM, SGLang, TensorRT-LLM, Triton.

Deliberately limited to parsing flags into an `ExportRequest` for `export_bundle` (export/api.py, the lifecycle);
each format's work lives in export/formats/ (registry: export/registry.py). Bad input is one line on stderr and exit
code 2, and nothing is left behind.

    python -m export --format pytorch --out bundles/cpu                         # default target + best shipped draft
    python -m export --draft drafts/smollm2-135m-eagle3 --format vllm --out bundles/vllm
    python -m export --draft drafts/my-eagle3 --format sglang --out bundles/sglang
    python -m export --target ./Qwen3-8B --draft drafts/qwen3-8b-eagle3 --format tensorrt-llm --tp 2 --out bundles/trt
    python -m export --target ./Qwen3-8B --draft drafts/qwen3-8b-eagle3 --format triton-repo --out bundles/triton
    python -m export --format onnx --quantization int4 --out bundles/onnx    # ONNX Runtime graph, 4-bit weights
    python -m export --format onnx --quantization auto --out bundles/onnx    # the weight format fastest on this CPU
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from deepspec.models.chat_templates import BUILTIN_CHAT_TEMPLATES
from deepspec.models.quantization import WEIGHT_FORMATS
from export.api import DTYPES, ExportError, ExportRequest, export_bundle
from export.registry import FORMAT_MODULES, FORMAT_RUNTIMES


def build_parser() -> argparse.ArgumentParser:
    formats = "\n".join(f"  {name:<13} {runtime}" for name, runtime in FORMAT_RUNTIMES.items())
    p = argparse.ArgumentParser(
        prog="python -m export",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Export a target and its trained draft as a bundle for a server or backend. Every bundle "
        "carries manifest.json (what it was made from, every file's sha256).",
        epilog=f"formats (--format) and the server or backend each is for:\n{formats}\n\n"
        "Layer ids, tensor names and what each engine refuses: export/DESIGN.md.",
    )
    g = p.add_argument_group("what to export")
    g.add_argument(
        "--target",
        default="smollm2-135m",
        help="target: an alias (smollm2-135m, gemma3-270m), a Hugging Face directory or a .gguf file "
        "(default smollm2-135m)",
    )
    g.add_argument(
        "--draft",
        default="auto",
        help="draft directory from python -m training; 'auto' = the best shipped draft for the target "
        "that the format can take (default); 'none' = target only; 'prompt-lookup' (pytorch only)",
    )
    g.add_argument("--format", required=True, metavar="FORMAT", help=f"one of: {', '.join(FORMAT_MODULES)} (see below)")
    g.add_argument(
        "--chat-template",
        default=None,
        metavar="NAME|FILE",
        help=f"chat template the export's tokenizer carries, for a target that ships none (gemma3-270m): "
        f"a built-in ({', '.join(BUILTIN_CHAT_TEMPLATES)}) or a Jinja file (default: the target's own)",
    )
    g = p.add_argument_group("output")
    g.add_argument(
        "--out",
        required=True,
        type=Path,
        help="the bundle's folder; written beside it under a scratch name and renamed at the end",
    )
    g.add_argument("--force", action="store_true", help="replace an existing, non-empty --out")
    g.add_argument(
        "--dtype",
        choices=DTYPES,
        default=None,
        help="weights dtype written (default: bfloat16; pytorch: the worker loads float32 or bfloat16)",
    )
    g = p.add_argument_group("engine settings")
    g.add_argument(
        "--tp",
        type=int,
        default=1,
        help="tensor-parallel ranks: one rank{r}.safetensors each (tensorrt-llm), tensor_parallel_size "
        "in launch snippets (default 1)",
    )
    g.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=3,
        help="draft tokens per verify step written into the launch snippets (default 3; 1-16)",
    )
    g.add_argument(
        "--quantization",
        choices=WEIGHT_FORMATS,
        default=None,
        help="weight format, the worker's option (default: the format's own, dense weights in --dtype). "
        "onnx: none (float32), int4 (4-bit blocks of 32 run by ONNX Runtime's MatMulNBits: ~3x "
        "smaller, faster batch-1 decode on CPU), int8 (per channel, MatMulIntegerToFloat on "
        "activations quantized per row: 2x int4's size, cheaper multi-token verify steps) or auto "
        "(export int8 and int4, time each one's verify steps here and keep the faster; the choice and "
        "both curves go into onnx.json). Other formats take none only; a value that does not apply "
        "is refused",
    )
    g.add_argument(
        "--build",
        action="store_true",
        help="tensorrt-llm: also run build.sh (trtllm-build) here; needs tensorrt_llm and a CUDA GPU, "
        "else exit 2 naming what is missing and the commands to run on a GPU host",
    )
    return p


def main(argv: list[str] | None = None, progress=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        request = ExportRequest(
            format=args.format,
            out=args.out,
            target=args.target,
            draft=args.draft,
            chat_template=args.chat_template,
            dtype=args.dtype,
            tp=args.tp,
            num_speculative_tokens=args.num_speculative_tokens,
            quantization=args.quantization,
            build=args.build,
            force=args.force,
        )
    except ExportError as e:  # a flag out of range or not for this format: usage, as argparse reports it
        parser.error(str(e))
    try:
        result = export_bundle(request, progress)
    except ExportError as e:
        print(f"python -m export: error: {e}", file=sys.stderr)
        return 2
    print(result.summary(request.format))
    return 0
