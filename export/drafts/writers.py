"""Write a draft directory in one engine's dialect: config.json + model.safetensors (+ what the engine reads beside).

`write_draft(engine, job, dest)` returns the manifest fields it settles (`engine_layer_ids`, the config keys the
launch snippets need). Refusals happen in `check_draft`, which every format runs before writing anything.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from export.drafts import block, eagle3
from export.errors import ExportError
from export.layer_ids import engine_layer_ids, hs_from_feature_layers

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_draft(engine: str, job) -> None:
    draft = job.draft
    if draft is None:
        return
    if not draft.is_neural:
        raise ExportError(f"{engine} cannot load {draft.path.name}: {draft.kind} runs only in DeepSpec's worker "
                          "(--format pytorch)")
    hs = hs_from_feature_layers(draft.cfg.feature_layers)
    if draft.algo == "eagle3":
        eagle3.check(engine, draft, job.target, hs)
        engine_layer_ids(engine, hs)  # raises where the engine cannot name these layers
    else:
        block.check(engine, draft, job.target)


def write_draft_dir(engine: str, job, out: Path, progress) -> dict:
    """The draft-only formats' one step: `write_draft` into out/draft under its progress bar."""
    with progress.task(f"{engine} draft", total=1) as advance:
        fields = write_draft(engine, job, out / "draft")
        advance(1)
    return fields


def write_draft(engine: str, job, dest: Path) -> dict:
    from safetensors.torch import save_file

    draft, target, dtype = job.draft, job.target, DTYPES[job.dtype]
    cfg = draft.cfg
    hs = hs_from_feature_layers(cfg.feature_layers)
    dest.mkdir(parents=True)
    if draft.algo == "eagle3":
        tensors = eagle3.dialect(eagle3.canonical_tensors(draft, target), engine, dtype)
        if engine == "vllm":
            config = _speculators_config(job, hs)
            if cfg.qkv_bias:  # Llama attention_bias also biases o_proj; ours has none
                tensors["layers.0.self_attn.o_proj.bias"] = torch.zeros(cfg.hidden_size, dtype=dtype)
        else:
            config = _eagle3_hf_config(job, engine, hs)
        layer_ids = {engine: engine_layer_ids(engine, hs)}
    else:
        tensors, config = block.convert(draft, target, engine, dtype)
        layer_ids = {engine: config["dflash_config"]["target_layer_ids"]}
    save_file(tensors, dest / "model.safetensors", metadata={"format": "pt"})
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return {"engine_layer_ids": layer_ids, "draft_config": config}


def _eagle3_hf_config(job, engine: str, hs) -> dict:
    """The `LlamaForCausalLMEagle3` directory SGLang and TensorRT-LLM load (midlayer.* keys)."""
    cfg = job.draft.cfg
    ids = engine_layer_ids(engine, hs)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        **eagle3.layer_config(cfg, job.target.config, "llama"),
        "draft_vocab_size": cfg.out_vocab_size,
        "target_hidden_size": job.target.arch.hidden_size,
        "torch_dtype": job.dtype,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True},
    }
    if engine == "tensorrt-llm":
        config["eagle_config"]["eagle3_layers_to_capture"] = ids
    return config


def _speculators_config(job, hs) -> dict:
    """The speculators format (`vllm serve DIR`): Eagle3Speculator with the layer config nested."""
    cfg = job.draft.cfg
    model_type = "qwen3" if cfg.qk_norm else "llama"
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": _speculators_version(),
        "transformer_layer_config": eagle3.layer_config(cfg, job.target.config, model_type),
        "draft_vocab_size": cfg.out_vocab_size,
        "target_hidden_size": job.target.arch.hidden_size,
        # absent means true to the speculators loader: always written
        "norm_before_residual": bool(cfg.norm_before_residual),
        "eagle_aux_hidden_state_layer_ids": engine_layer_ids("vllm", hs),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": job.num_speculative_tokens}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": str(job.target.path),
                         "architectures": job.target.config.get("architectures") or []},
        },
        "torch_dtype": job.dtype,
    }


def _speculators_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("speculators")
    except metadata.PackageNotFoundError:
        return "0.9.0"
