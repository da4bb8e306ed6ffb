"""The worker's settings: one engine and its KServe v2 server (see `service.settings` for how they are filled).

Target and quantization defaults come from the library the worker runs (`deepspec.models`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from deepspec.models.aliases import DEFAULT_TARGET
from deepspec.models.backends import AUTO, check_backend_choice
from deepspec.models.quantization import QUANTIZATIONS, Quantization
from service.settings import ServiceSettings
from service.worker.fastest_engine import ENGINES

__all__ = ["ENGINES", "EmbeddedWorkerSettings", "QUANTIZATIONS", "WorkerSettings"]


class WorkerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="DEEPSPEC_WORKER_", extra="forbid")

    #: target alias, HF directory or GGUF file; "stub" = a weightless test target (tests, overhead benchmark)
    target: str = DEFAULT_TARGET
    #: draft directory, "prompt-lookup", "none" (target only) or "auto" (best shipped draft)
    draft: str = "auto"
    #: `python -m export` output; its manifest.json sets target, draft and dtype where they are not given explicitly
    engine_dir: Path | None = None
    #: "auto" = the engine measured fastest on this machine (the PyTorch engine, the ONNX export or the native CPU
    #: decoder, cached after the first start: service/worker/fastest_engine.py); "pytorch" / "onnx" / "native" = that
    #: one (deepspec/models/backends.py)
    engine: str = AUTO
    #: KServe v2 gRPC port (0 = pick a free one)
    port: int = Field(8001, ge=0, le=65535)
    #: Prometheus /metrics HTTP port (0 = pick a free one, -1 = off)
    metrics_port: int = Field(8002, ge=-1, le=65535)
    device: Literal["cpu", "cuda"] = "cpu"
    dtype: Literal["float32", "bfloat16"] = "bfloat16"  # bf16 decodes ~2x faster on CPU (prepacked oneDNN matmuls)
    #: "gguf" = keep a GGUF target's 4-bit matmul weights (CPU, bf16: ~2x faster batch-1 decode); "auto" = gguf
    #: where it applies, else "none" (dense weights in `dtype`)
    quantization: Quantization = "auto"
    #: chat template for a target that ships none: a built-in (smollm2, qwen, gemma3) or a Jinja file
    chat_template: str | None = None
    #: sequences decoded together in one engine step
    max_batch_size: int = Field(8, ge=1)
    #: requests waiting for a batch slot before new ones get RESOURCE_EXHAUSTED (the gateway's 429)
    max_queue: int = Field(64, ge=0)
    #: prompt tokens prefilled per engine step at most (one request always fits): lower = smoother TTFT under bursts
    max_prefill_tokens_per_step: int = Field(512, ge=1)
    #: context length cap, tokens (prompt + max_tokens); None = the context the target declares (its config's
    #: max_position_embeddings, a GGUF's context_length), lowered where the KV cache for `max_batch_size` sequences
    #: would not fit in `kv_cache_memory_fraction` of the memory available at start (service/worker/context.py)
    max_seq_len: int | None = Field(None, ge=16)
    #: share of the memory available after the weights load that the KV cache may take (vLLM's
    #: gpu_memory_utilization, for the host's memory); decides the served context where --max-seq-len is not given
    kv_cache_memory_fraction: float = Field(0.5, gt=0, le=1)
    #: draft tokens proposed per verify round
    num_speculative_tokens: int = Field(7, ge=1, le=32)
    #: stub target only: simulated time per forward, milliseconds
    stub_step_ms: float = Field(0.0, ge=0)

    @field_validator("engine")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        return check_backend_choice(value)

    @model_validator(mode="after")
    def _apply_engine_dir(self):
        if self.engine_dir is not None:
            from service.worker.engine_dir import read_engine_dir

            for name, value in read_engine_dir(self.engine_dir).worker_fields().items():
                if name not in self.model_fields_set:  # a flag (or env var) beats the manifest
                    setattr(self, name, value)
        return self


class EmbeddedWorkerSettings(WorkerSettings):
    """The in-process worker of `python -m service` (embedded): on loopback and any free port, since only its own
    gateway talks to it; --worker-port or DEEPSPEC_WORKER_PORT picks a port."""

    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535)
