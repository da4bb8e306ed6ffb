"""The worker's settings: one engine and its KServe v2 server (see `service.settings` for how they are filled).

Target, backend and weight-format choices come from the library the worker runs (`deepspec.models`). The old names
`engine` and `engine_dir` (flags `--engine`, `--engine-dir`, variables DEEPSPEC_WORKER_ENGINE and
DEEPSPEC_WORKER_ENGINE_DIR) are still read, with a FutureWarning naming the new one: an inference backend is a
*backend* and an export's folder a *bundle*, "engine" being the library's SpecEngine only.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from deepspec.models.aliases import DEFAULT_TARGET
from deepspec.models.backends import AUTO, check_backend_choice, resolve_backend
from deepspec.models.quantization import QUANTIZATIONS, WEIGHT_FORMATS, WeightFormat
from service.settings import ServiceSettings
from service.worker.fastest_backend import BACKENDS

__all__ = ["BACKENDS", "EmbeddedWorkerSettings", "QUANTIZATIONS", "WEIGHT_FORMATS", "WorkerSettings"]


class WorkerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="DEEPSPEC_WORKER_", extra="forbid")

    #: target alias, HF directory or GGUF file; "stub" = a weightless test target (tests, overhead benchmark)
    target: str = DEFAULT_TARGET
    #: draft directory, "prompt-lookup", "none" (target only) or "auto" (best shipped draft)
    draft: str = "auto"
    #: a bundle `python -m export` wrote; its manifest.json sets target, draft and dtype where they are not given
    bundle_dir: Path | None = None
    #: the inference backend (deepspec/models/backends.py): "auto" = the one measured fastest on this machine (the
    #: PyTorch decoder, ONNX Runtime on an export made on the first start, or the native CPU decoder, cached after the
    #: first start: service/worker/fastest_backend.py); "pytorch" / "onnx" / "native" = that one
    backend: str = AUTO
    #: deprecated name of `backend` (DEEPSPEC_WORKER_ENGINE, --engine): read, moved to `backend`, warned about
    engine: str | None = None
    #: deprecated name of `bundle_dir` (DEEPSPEC_WORKER_ENGINE_DIR, --engine-dir)
    engine_dir: Path | None = None
    #: KServe v2 gRPC port (0 = pick a free one)
    port: int = Field(default=8001, ge=0, le=65535)
    #: Prometheus /metrics HTTP port (0 = pick a free one, -1 = off)
    metrics_port: int = Field(default=8002, ge=-1, le=65535)
    device: Literal["cpu", "cuda"] = "cpu"
    dtype: Literal["float32", "bfloat16"] = "bfloat16"  # bf16 decodes ~2x faster on CPU (prepacked oneDNN matmuls)
    #: the weight format (deepspec/models/quantization.py): "auto" = the backend's own choice; "none" / "gguf"
    #: (pytorch: dense in `dtype`, a GGUF target's 4-bit weights), "int8" / "int4" (onnx: the first start's export;
    #: native). A value the backend does not honour is refused; backend auto weighs only the backends that honour
    #: it (gguf: pytorch alone, not measured; int8 / int4: onnx and native, measured; none: pytorch and onnx)
    quantization: WeightFormat = "auto"
    #: chat template for a target that ships none: a built-in (smollm2, qwen, gemma3) or a Jinja file
    chat_template: str | None = None
    #: sequences decoded together in one engine step
    max_batch_size: int = Field(default=8, ge=1)
    #: requests waiting for a batch slot before new ones get RESOURCE_EXHAUSTED (the gateway's 429)
    max_queue: int = Field(default=64, ge=0)
    #: prompt tokens prefilled per engine step at most (one request always fits): lower = smoother TTFT under bursts
    max_prefill_tokens_per_step: int = Field(default=512, ge=1)
    #: context length cap, tokens (prompt + max_tokens); None = the context the target declares (its config's
    #: max_position_embeddings, a GGUF's context_length), lowered where the KV cache for `max_batch_size` sequences
    #: would not fit in `kv_cache_memory_fraction` of the memory available at start (service/worker/context.py)
    max_seq_len: int | None = Field(default=None, ge=16)
    #: share of the memory available after the weights load that the KV cache may take (vLLM's
    #: gpu_memory_utilization, for the host's memory); decides the served context where --max-seq-len is not given
    kv_cache_memory_fraction: float = Field(default=0.5, gt=0, le=1)
    #: draft tokens proposed per verify round
    num_speculative_tokens: int = Field(default=7, ge=1, le=32)
    #: how deep a round verifies: `budget` prices each depth on this machine's step curve and drafts only what pays
    #: (deepspec/decoding/planner.py BudgetPlanner); `verify-all` verifies every proposed token up to
    #: num_speculative_tokens, however full the batch (vLLM's fixed depth; the baseline the budget is measured against)
    planner: Literal["budget", "verify-all"] = "budget"
    #: stub target only: simulated time per forward, milliseconds
    stub_step_ms: float = Field(default=0.0, ge=0)

    @field_validator("backend", "engine")
    @classmethod
    def _known_backend(cls, value: str | None) -> str | None:
        return value if value is None else check_backend_choice(value)

    @model_validator(mode="after")
    def _move_deprecated_names(self):
        """engine -> backend and engine_dir -> bundle_dir, once, with a warning; both names set differently is an
        error (which one was meant?)."""
        for old, new in (("engine", "backend"), ("engine_dir", "bundle_dir")):
            value = getattr(self, old)
            if value is None:
                continue
            flag, variable = f"--{old.replace('_', '-')}", f"DEEPSPEC_WORKER_{old.upper()}"
            if new in self.model_fields_set and getattr(self, new) != value:
                raise ValueError(
                    f"{flag} ({variable}) is the deprecated name of --{new.replace('_', '-')}: give only the new one"
                )
            warnings.warn(
                f"{flag} / {variable} is deprecated: use --{new.replace('_', '-')} / "
                f"DEEPSPEC_WORKER_{new.upper()} (same values)",
                FutureWarning,
                stacklevel=2,
            )
            setattr(self, new, value)
            setattr(self, old, None)
            self.model_fields_set.add(new)
        return self

    @model_validator(mode="after")
    def _weight_format_applies(self):
        """A weight format the chosen backend does not honour is refused, never ignored; with backend auto the
        choice weighs only the backends that honour it, each loaded in it (fastest_backend.choose_backend), so
        every value applies there (a bundle and the stub target carry their own weights)."""
        if self.quantization == AUTO or self.backend == AUTO or self.bundle_dir is not None or self.target == "stub":
            return self
        resolve_backend(self.backend).check_weight_format(self.quantization)
        return self

    @model_validator(mode="after")
    def _apply_bundle_dir(self):
        if self.bundle_dir is not None:
            from service.worker.bundle import read_bundle

            for name, value in read_bundle(self.bundle_dir).worker_fields().items():
                if name not in self.model_fields_set:  # a flag (or env var) beats the manifest
                    setattr(self, name, value)
        return self


class EmbeddedWorkerSettings(WorkerSettings):
    """The in-process worker of `python -m service` (embedded): on loopback and any free port, since only its own
    gateway talks to it; --worker-port or DEEPSPEC_WORKER_PORT picks a port."""

    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535)
