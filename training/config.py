"""The training configuration: one strict pydantic model per section; files and dotted overrides go through the
same validation (`python -m training train -c run.yaml optim.lr=1e-4`). Unknown keys are errors."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from deepspec.algorithms import check_layout, resolve_algorithm


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TargetSection(StrictModel):
    name: str = Field(
        default="smollm2-135m", description="alias (smollm2-135m), .gguf file, or Hugging Face model directory"
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        default="float32", description="float32 on CPU; bfloat16 on GPU halves memory and feature bandwidth"
    )
    device: str = Field(default="cpu", description="cpu, cuda (with torchrun each rank takes cuda:<local_rank>)")
    chat_template: str | None = Field(
        default=None,
        description=(
            "chat template for a target that ships none (gemma3-270m): a built-in (smollm2, qwen, gemma3) or a Jinja "
            "file; None = the tokenizer's own"
        ),
    )


class ModelSection(StrictModel):
    algo: str = Field(
        default="eagle3",
        description="a registered draft algorithm: eagle3 | dflash | dspark built in (deepspec/algorithms)",
    )
    num_layers: int | None = Field(
        default=None,
        ge=1,
        le=16,
        description=(
            "draft decoder layers; None = the algorithm's default: 1 for eagle3, 2 for dflash/dspark (DeepSpec uses 5 "
            "on 4B targets)"
        ),
    )
    block_size: int = Field(default=7, ge=1, le=32, description="block size / TTT unroll γ (7 = what serving verifies)")
    draft_vocab_size: int = Field(
        default=8192,
        ge=0,
        description="reduced draft vocabulary: top-N tokens of the training answers (0 = full vocabulary)",
    )
    markov_rank: int = Field(
        default=64, ge=1, description="dspark Markov head rank r (DeepSpec 256; 64 for small targets)"
    )
    feature_layers: list[int] | None = Field(
        default=None,
        description=(
            "target layers feeding the draft, as 'output of layer i' ids (= HF hidden_states[i+1]); None = 5 evenly "
            "spaced, never the last (canonical layout: the engines' 3, {1, L//2-1, L-4})"
        ),
    )
    layout: str = Field(
        default="deepspec",
        description=(
            "tensor layout, one of the algorithm's: deepspec (flat names, frozen target head) or canonical (the EAGLE-3"
            " layout SGLang/vLLM/TensorRT-LLM load: Llama-style midlayer, 3 captured layers, own lm_head, d2t/t2d)"
        ),
    )
    calibration_sequences: int = Field(
        default=32,
        ge=0,
        description=(
            "dspark: last rows of the data held out of training to fit the per-slot confidence temperatures (at most "
            "10% of the rows; 0 = uncalibrated)"
        ),
    )

    @field_validator("feature_layers")
    @classmethod
    def _ascending(cls, layers: list[int] | None) -> list[int] | None:
        if layers is not None:
            from deepspec.models.drafts.config import check_feature_layer_order

            check_feature_layer_order(layers, "model.feature_layers")
        return layers

    @field_validator("algo")
    @classmethod
    def _registered(cls, algo: str) -> str:
        try:
            resolve_algorithm(algo)
        except KeyError as exc:
            raise ValueError(exc.args[0]) from None
        return algo


class DataSection(StrictModel):
    paths: list[Path] = Field(
        default=[],
        description=(
            "regenerated conversations (`python -m training prepare`), or pre-tokenized {'input_ids', 'loss_mask'} "
            "rows; with labels=target also {'text'} and {'turns'} rows (datasets/train/*.jsonl.gz)"
        ),
    )
    labels: Literal["regen", "target"] = Field(
        default="regen",
        description=(
            "regen: learn the target-written answers of `prepare` (soft target distribution for eagle3, next token for "
            "dflash/dspark CE); target: distil the target's own distribution over any text, labels and features from "
            "one prefill (KL per draft slot)"
        ),
    )
    label_top_k: int = Field(
        default=32,
        ge=0,
        description=(
            "labels=target: keep the target's top-k draft-vocabulary probabilities per token (0 = the whole draft "
            "vocabulary; 32 keeps 256 bytes per token)"
        ),
    )
    max_len: int = Field(
        default=1024, ge=8, description="tokens per training sequence (longer conversations are truncated); 512-2048"
    )
    num_anchors: int = Field(
        default=64,
        ge=1,
        description="dflash/dspark: anchors (blocks) packed per sequence and forward (DeepSpec 512; 32-128 on CPU)",
    )
    batch_size: int = Field(default=1, ge=1, description="sequences per micro-batch (right-padded)")
    max_sequences: int | None = Field(
        default=None,
        ge=1,
        description=(
            "train on the first N sequences of the data only (file order; None = all): an offline cache is written "
            "for every sequence before the first step, so a run that has hours, not days, caches what it can train"
        ),
    )


class OptimSection(StrictModel):
    lr: float = Field(default=5e-4, gt=0, description="AdamW peak learning rate")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW decoupled weight decay (0-0.1)")
    betas: tuple[float, float] = Field(default=(0.9, 0.95), description="AdamW betas")
    warmup_steps: int = Field(
        default=20, ge=0, description="linear warmup steps, then cosine decay to min_lr_ratio · lr at max_steps"
    )
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1, description="final learning rate as a fraction of lr")
    max_steps: int = Field(default=1000, ge=1, description="optimizer steps (each = grad_accum micro-batches)")
    grad_accum: int = Field(default=1, ge=1, description="micro-batches per optimizer step")
    clip_norm: float = Field(default=1.0, ge=0, description="gradient clipping max norm (0 = off)")
    max_minutes: float | None = Field(
        default=None,
        gt=0,
        description="stop early (and save) after this many minutes of training; None = run max_steps",
    )


class DistSection(StrictModel):
    backend: Literal["auto", "gloo", "nccl"] = Field(
        default="auto", description="torch.distributed backend under torchrun: auto = nccl on GPU, gloo on CPU"
    )
    fsdp: bool = Field(
        default=False,
        description=(
            "shard parameters and AdamW state with FSDP (fully_shard) instead of replicating them with DDP: drafts too "
            "large for one device; runs on gloo (CPU) and nccl"
        ),
    )


class TrainConfig(StrictModel):
    target: TargetSection = TargetSection()
    model: ModelSection = ModelSection()
    data: DataSection = DataSection()
    optim: OptimSection = OptimSection()
    dist: DistSection = DistSection()
    output_dir: Path = Field(
        default=Path("runs/draft"),
        description="where checkpoints/ and the final draft (config.json, model.safetensors, ...) go",
    )
    init_from: Path | None = Field(
        default=None,
        description=(
            "fine-tune an existing draft checkpoint (e.g. drafts/smollm2-135m-dflash) instead of a fresh init: its "
            "weights, vocabulary and sizes replace model.num_layers/block_size/draft_vocab_size/...; model.algo must "
            "match"
        ),
    )
    cache_dir: Path | None = Field(
        default=None,
        description="offline mode: cache only the needed target hidden states here; None = online (target in the loop)",
    )
    features_from: Literal["target", "native"] = Field(
        default="target",
        description=(
            "what computes the target's features and final hidden states, online or into the offline cache: the "
            "training target (PyTorch, data.labels regen or target), or the native CPU decoder on the target's served "
            "weights (data.labels regen only; several times faster on a CPU, and the features a draft then learns "
            "are the ones the native backend serves it)"
        ),
    )
    seed: int = Field(default=0, description="seed of init, data order and anchor sampling")
    precision: Literal["auto", "fp32", "bf16"] = Field(
        default="auto",
        description=(
            "auto = bf16 autocast on GPU and on a CPU with native bf16 (AVX512-BF16, AMX), fp32 on other CPUs; "
            "bf16 = autocast everywhere (bf16 matmuls, the loss's target distributions stay fp32)"
        ),
    )
    save_every: int = Field(
        default=100, ge=0, description="save a resumable checkpoint every N optimizer steps (0 = only at the end)"
    )
    keep_checkpoints: int = Field(default=2, ge=1, description="keep only the newest N step checkpoints")
    save_dtype: Literal["float32", "bfloat16", "int8", "q4"] = Field(
        default="float32",
        description=(
            "final draft weights storage: bfloat16 halves the shipped size, int8 (one scale per output row) quarters "
            "it, q4 (4-bit blocks of 32, deepspec/models/drafts/storage.py) takes it to about a sixth"
        ),
    )

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if self.model.draft_vocab_size and self.model.draft_vocab_size < 16:
            raise ValueError("model.draft_vocab_size must be 0 (full vocabulary) or >= 16")
        check_layout(self.model.algo, self.model.layout)
        return self


def _parse_value(text: str):
    """Dotted override values are YAML scalars/lists: 3e-4, true, [1, 8, 15], null, runs/x."""
    import yaml

    return yaml.safe_load(text)


def _deep_merge(base: dict, update: dict) -> dict:
    out = dict(base)
    for key, value in update.items():
        out[key] = _deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def read_config_file(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    text = path.read_text()
    if path.suffix == ".json":
        data = json.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a config file must hold a mapping of sections (target, model, data, optim, ...)")
    return data


def apply_override(data: dict, item: str) -> dict:
    if "=" not in item:
        raise ValueError(f"override '{item}' must look like section.key=value (e.g. optim.lr=3e-4)")
    key, value = item.split("=", 1)
    node: dict = {}
    cur = node
    parts = key.strip().split(".")
    for part in parts[:-1]:
        cur[part] = {}
        cur = cur[part]
    cur[parts[-1]] = _parse_value(value)
    return _deep_merge(data, node)


def load_config(files: Sequence[Path] = (), flags: dict | None = None, overrides: Sequence[str] = ()) -> TrainConfig:
    """defaults < files (in order) < flags (dotted keys) < overrides; validated once at the end."""
    data: dict = {}
    for f in files:
        data = _deep_merge(data, read_config_file(Path(f)))
    for key, value in (flags or {}).items():
        if value is not None:
            data = apply_override(data, f"{key}={json.dumps(value) if not isinstance(value, str) else value}")
    for item in overrides:
        data = apply_override(data, item)
    return TrainConfig.model_validate(data)


def describe_config() -> str:
    """Every config key with its type, default and meaning — the `train --help` epilog."""
    lines = ["config keys (YAML/JSON sections or dotted overrides):"]

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, f in model.model_fields.items():
            ann = f.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, f"{prefix}{name}.")
                continue
            default = f.default if not isinstance(f.default, Path) else str(f.default)
            lines.append(f"  {prefix}{name} = {default!r}: {f.description or ''}")

    walk(TrainConfig, "")
    return "\n".join(lines)
