"""`--format tensorrt-llm`: the TensorRT-LLM checkpoint of the target, the EAGLE-3 draft, and both ways to serve.

- `checkpoint/`: config.json + rank{r}.safetensors, already sharded for --tp (export/trtllm_checkpoint.py).
- `draft/`: the EAGLE-3 draft in the `midlayer.*` layout TensorRT-LLM's PyTorch backend loads.
- `trtllm-serve.yaml`: LLM-API options with `speculative_config` for `trtllm-serve TARGET --config trtllm-serve.yaml`
  (current releases serve the Hugging Face target directly through the PyTorch backend).
- `build.sh`: the <= 1.2 engine flow (`trtllm-build` on checkpoint/, draft tokens verified in the engine, DeepSpec's
  verification plugins registered in the build process). TensorRT-LLM 1.2 is the last release with that flow.

`--build` runs build.sh here when tensorrt_llm and a CUDA GPU are present; otherwise the export stops before
writing anything, naming what is missing and the commands to run on a GPU host.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import yaml

from export import snippets
from export.drafts.writers import DTYPES, check_draft, write_draft
from export.errors import ExportError
from export.job import ExportFormat, ExportJob
from export.trtllm_checkpoint import ARCHITECTURES, check_sizes, checkpoint_config, rank_tensors
from plugins.schema import TRT_NAMESPACE

ENGINE = "tensorrt-llm"
#: TensorRT plugins of DeepSpec's verification ops (plugins/README.md, plugins/tensorrt.py): registered by
#: `import plugins.tensorrt`, which compiles each op's Triton kernel ahead of time for the building GPU
#: build.sh's `--max_batch_size`: the <= 1.2 engine's batch bound, which the Triton ensemble around it
#: (export/formats/triton_repo.py) must not exceed
ENGINE_MAX_BATCH_SIZE = 8
PLUGIN_OPS = tuple(
    f"{TRT_NAMESPACE}::{op}"
    for op in ("greedy_accept", "rejection_sample", "process_logits", "tree_accept", "confidence_truncate")
)


def build_blockers() -> list[str]:
    """What `--build` needs and this machine lacks."""
    missing = []
    if importlib.util.find_spec("tensorrt_llm") is None:
        missing.append(
            "tensorrt_llm is not installed (TensorRT-LLM <= 1.2 with TensorRT; the PyPI stub does not count)"
        )
    try:
        import torch

        if not torch.cuda.is_available():
            missing.append("no CUDA GPU is visible")
    except ImportError:
        missing.append("torch is not installed")
    return missing


def check(job: ExportJob) -> None:
    check_sizes(job.target.arch, job.tp)
    check_draft(ENGINE, job)  # the algorithms with a tensorrt-llm writer: EAGLE-3
    if job.build and (missing := build_blockers()):
        raise ExportError(
            f"--build: {'; '.join(missing)}. Export without --build here, then on a GPU host with "
            "TensorRT-LLM 1.2: sh OUT/build.sh (or serve without building: trtllm-serve TARGET --config "
            "OUT/trtllm-serve.yaml)"
        )


def write(job: ExportJob, out: Path, progress) -> dict:
    from safetensors.torch import save_file

    arch, dtype = job.target.arch, DTYPES[job.dtype]
    ckpt = out / "checkpoint"
    ckpt.mkdir()
    config = checkpoint_config(arch, job.dtype, job.tp, job.target.config)
    (ckpt / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    with progress.task(f"TensorRT-LLM checkpoint, {job.tp} rank(s)", total=job.tp) as advance:
        for rank in range(job.tp):
            save_file(rank_tensors(job.target.tensor, arch, job.tp, rank, dtype), ckpt / f"rank{rank}.safetensors")
            advance(1)
    fields = {"tp": job.tp, "checkpoint": "checkpoint", "architecture": ARCHITECTURES[arch.family]}
    draft_dir = None
    if job.draft is not None:
        with progress.task(f"{job.draft.algo} draft", total=1) as advance:
            fields.update(write_draft(ENGINE, job, out / "draft"))
            advance(1)
        draft_dir = "draft"
        fields["draft"] = "draft"
    llm_args = {**snippets.trtllm_llm_args(job, draft_dir, str(job.target.path)), **snippets.TRTLLM_SERVE_METRICS}
    (out / "trtllm-serve.yaml").write_text(yaml.safe_dump(llm_args, sort_keys=False))
    serve = f"trtllm-serve {job.target.path} --config trtllm-serve.yaml"
    snippets.write_script(out / "launch" / "trtllm-serve.sh", serve)
    build = build_script(job)
    (out / "build.sh").write_text(build)
    (out / "build.sh").chmod(0o755)
    snippets.write_readme(
        out,
        "TensorRT-LLM export",
        f"Target `{job.target.spec}` ({config['architecture']}, tp "
        f"{job.tp}, {job.dtype}), draft `{job.draft.path.name if job.draft else 'none'}`.",
        {
            "Serve (PyTorch backend, current releases)": f"```sh\n{serve}\n```",
            "Build an engine (TensorRT-LLM <= 1.2)": "```sh\nsh build.sh\n```\n\nbuild.sh "
            "registers DeepSpec's verification plugins (" + ", ".join(PLUGIN_OPS) + ") in the "
            "build process, so networks that name them resolve; EAGLE-3 itself runs only in the "
            "PyTorch backend (the <= 1.2 engine EAGLE mode is EAGLE-1/2).",
        },
    )
    fields["launch"] = {"trtllm-serve": serve, "build": "sh build.sh"}
    if job.build:
        with progress.task("trtllm-build", total=1) as advance:
            result = subprocess.run(["sh", str(out / "build.sh")], cwd=out, capture_output=True, text=True)
            if result.returncode != 0:
                raise ExportError(f"build.sh failed ({result.returncode}): {result.stderr.strip()[-500:]}")
            advance(1)
        fields["engine_dir"] = "engine"
    return fields


def build_script(job: ExportJob) -> str:
    k = job.num_speculative_tokens
    spec = f"--speculative_decoding_mode draft_tokens_external --max_draft_len {k}" if job.draft is not None else ""
    return f"""#!/bin/sh
# TensorRT-LLM <= 1.2 engine flow for this export (the last release with trtllm-build). Run on a GPU host with
# tensorrt_llm installed, from a DeepSpec checkout (for the verification plugins):
#   DEEPSPEC=/path/to/deepspec sh build.sh
set -e
cd "$(dirname "$0")"
DEEPSPEC="${{DEEPSPEC:-$(python -c 'import deepspec, os; print(os.path.dirname(os.path.dirname(deepspec.__file__)))')}}"
ARCH="${{ARCH:-$(python -c 'import torch; m, n = torch.cuda.get_device_capability(); print(f"{{m}}{{n}}")')}}"
# 1. Compile DeepSpec's verification kernels ahead of time (PTX + cubin) for this GPU.
(cd "$DEEPSPEC" && python -m plugins build --arch "$ARCH" --out "$OLDPWD/plugins-build")
# 2. Build the engine with the plugins registered in the same process ({", ".join(PLUGIN_OPS)}), on the
#    interpreter that owns tensorrt_llm and its pinned packages (TRTLLM_PYTHON; DeepSpec's GPU image sets it).
PYTHONPATH="$DEEPSPEC${{PYTHONPATH:+:$PYTHONPATH}}" "${{TRTLLM_PYTHON:-python}}" -c '
import sys
import plugins.tensorrt  # registers the deepspec:: TensorRT plugins
from tensorrt_llm.commands.build import main
sys.argv[0] = "trtllm-build"
main()
' --checkpoint_dir checkpoint --output_dir engine --gemm_plugin {job.dtype} \\
  --max_batch_size {ENGINE_MAX_BATCH_SIZE} --max_seq_len 4096 {spec} "$@"
echo "engine written to $(pwd)/engine"
"""


FORMAT = ExportFormat(
    name=ENGINE,
    runtime="TensorRT-LLM (trtllm-serve --config; trtllm-build <= 1.2)",
    write=write,
    check=check,
    needs_neural_draft=False,
    families=tuple(ARCHITECTURES),
)
