"""Each engine's own launch snippet for an export, written into the output (`launch/`) and its README.md.

The commands name the target by the Hugging Face directory the export read (for an alias, the dequantized copy in
DeepSpec's cache): on the serving host, replace it with that host's copy of the same model. Each engine's name of
the draft algorithm is that engine's writer's (`DraftWriter.engine_name`, from the algorithm's record).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from export.drafts.writers import draft_writer


def vllm_speculative_config(job, draft_dir: str) -> dict:
    return {
        "method": draft_writer("vllm", job.draft).engine_name,
        "model": draft_dir,
        "num_speculative_tokens": job.num_speculative_tokens,
    }


def _chat_template_flag(job) -> str:
    """` --chat-template chat_template.jinja` when the export was given one (written beside manifest.json; the
    launch scripts run from the export directory); vLLM and SGLang take a file there."""
    from deepspec.models.chat_templates import CHAT_TEMPLATE_FILE

    return f" --chat-template {CHAT_TEMPLATE_FILE}" if job.options.get("chat_template") is not None else ""


def vllm_command(job, draft_dir: str) -> str:
    spec = json.dumps(vllm_speculative_config(job, draft_dir))
    return (
        f"vllm serve {shlex.quote(str(job.target.path))} --tensor-parallel-size {job.tp} "
        f"--dtype {job.dtype} --speculative-config {shlex.quote(spec)}{_chat_template_flag(job)}"
    )


def sglang_command(job, draft_dir: str) -> str:
    k, algorithm = job.num_speculative_tokens, draft_writer("sglang", job.draft).engine_name
    return (
        f"python -m sglang.launch_server --model-path {shlex.quote(str(job.target.path))} --tp {job.tp} "
        f"--dtype {job.dtype} --speculative-algorithm {algorithm} "
        f"--speculative-draft-model-path {shlex.quote(draft_dir)} --speculative-num-steps {k} "
        f"--speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}{_chat_template_flag(job)}"
    )


def trtllm_speculative_config(job, draft_dir: str) -> dict:
    """TensorRT-LLM's `speculative_config` for the pinned release (export/trtllm_releases.py: the `decoding_type`
    its `DecodingBaseConfig.from_dict` dispatches, the keys its StrictBaseModel declares). The draft is named by
    `speculative_model_dir`: the field's name in the 1.x releases. The writer's `speculative_options` add the
    algorithm's keys: for EAGLE-3 the one-model selector, `allow_advanced_sampling` and `eagle3_layers_to_capture`
    ("output of layer" ids; TensorRT-LLM reads the captured layers from here, not from the draft's config.json, and
    falls back to {1, L//2-1, L-4} without it)."""
    writer = draft_writer("tensorrt-llm", job.draft)
    spec = {
        "decoding_type": writer.engine_name,
        "max_draft_len": job.num_speculative_tokens,
        "speculative_model_dir": draft_dir,
    }
    if writer.speculative_options is not None:
        spec.update(writer.speculative_options(job))
    return spec


def trtllm_llm_args(job, draft_dir: str | None, model: str) -> dict:
    """The LLM-API kwargs (`trtllm-serve MODEL --config cfg.yaml`, Triton's model.yaml): backend pytorch."""
    args = {"backend": "pytorch", "tensor_parallel_size": job.tp, "dtype": job.dtype}
    if draft_dir is not None:
        args["speculative_config"] = trtllm_speculative_config(job, draft_dir)
    return args


#: LLM-API options trtllm-serve needs for its Prometheus endpoint (`/prometheus/metrics`, mounted only with
#: `return_perf_metrics`; the queue gauges come from the iteration stats): tensorrt_llm/serve/openai_server.py
#: `OpenAIServer.register_routes` / `mount_metrics`
TRTLLM_SERVE_METRICS = {"enable_iter_perf_stats": True, "return_perf_metrics": True}


def write_script(path: Path, command: str) -> None:
    """A launch script that runs `command` plus its own arguments. `exec`: the engine replaces the shell, so the
    signals a container runtime sends (SIGTERM to PID 1 on a drain) reach the engine, not a shell that ignores them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"#!/bin/sh\n# Written by python -m export; run from the export directory.\nset -e\n"
        f'cd "$(dirname "$0")/.."\nexec {command} "$@"\n'
    )
    path.chmod(0o755)


def write_readme(out: Path, title: str, intro: str, sections: dict[str, str]) -> None:
    text = [f"# {title}", "", intro, ""]
    for heading, body in sections.items():
        text += [f"## {heading}", "", body.rstrip(), ""]
    text += [
        "## Files",
        "",
        "`manifest.json` lists every file with its sha256, the target's fingerprint, the draft and "
        "the captured layers (as Hugging Face `hidden_states` indices).",
        "",
    ]
    (out / "README.md").write_text("\n".join(text))
