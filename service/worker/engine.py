"""Build the engine a worker hosts: the real `deepspec` SpecEngine over the target the settings name, or over the
stub target (`--target stub`: service/worker/stub_target.py) for tests and the gateway-overhead benchmark."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from deepspec.decoding import SpecEngine
from deepspec.decoding.planner import BudgetPlanner, RoundPlanner
from deepspec.models import Target
from service.worker.context import decide_context

logger = logging.getLogger(__name__)


@dataclass
class LoadedEngine:
    target: Target
    engine: SpecEngine
    #: the drafter's registry name, "none" without one
    drafter_name: str
    max_seq_len: int
    #: which inference backend serves and why (service/worker/fastest_backend.py)
    backend_choice: str = ""


def load_engine(settings) -> LoadedEngine:
    """Load weights and build the engine (blocking: seconds for the default target on CPU)."""
    if settings.target == "stub":
        return _load_stub(settings)
    choice, settings, target, drafter = load_served_model(settings)
    max_seq_len = decide_context(target, settings, settings.num_speculative_tokens).tokens
    engine = SpecEngine(
        target,
        drafter,
        max_batch_size=settings.max_batch_size,
        max_seq_len=max_seq_len,
        num_speculative_tokens=settings.num_speculative_tokens,
        planner=BudgetPlanner.kept_per_machine(target, drafter) if settings.planner == "budget" else RoundPlanner(),
    )
    drafter_name = "none" if drafter is None else getattr(drafter, "name", type(drafter).__name__)
    logger.info(
        "loaded target %s (quantization %s) with drafter %s (context %d tokens)",
        target.name,
        target.quantization,
        drafter_name,
        max_seq_len,
    )
    if engine.planner.step_time is not None:
        logger.info(
            "verification budget on: %s (the curve cached for this machine, recorded by the export, or "
            "probed at start; corrected by the passes served)",
            engine.planner.step_time,
        )
    return LoadedEngine(target, engine, drafter_name, max_seq_len, f"{choice.backend}: {choice.reason}")


def load_served_model(settings):
    """(engine choice, the settings it leaves, target, drafter): what a worker with these settings serves, loaded
    as it loads them (the benchmarks' `served` row reuses this)."""
    from deepspec.decoding import build_drafter
    from deepspec.models.backends import PYTORCH, available_backends, resolve_backend
    from service.worker.fastest_backend import choose_backend, load_with

    choice = choose_backend(settings)
    logger.info("backend: %s (%s)", choice.backend, choice.reason)
    settings = settings.model_copy(update=choice.worker_fields())
    # a bundle (--bundle-dir) loads as its format says: the PyTorch loader opens an onnx bundle as its ONNX Runtime
    # graph, and its own neural draft through its graphs; the native decoder computes in its own weight formats
    backend = resolve_backend(choice.backend if choice.backend in available_backends() else PYTORCH)
    target = load_with(
        backend,
        settings.target,
        weights=settings.quantization,
        dtype=settings.dtype,
        device=settings.device,
        chat_template=settings.chat_template,
    )
    return choice, settings, target, build_drafter(settings.draft, target)


def _load_stub(settings) -> LoadedEngine:
    """The stub target under the real engine. `--draft none` runs target-only, `prompt-lookup` / `random` the real
    drafters, anything else (the default `auto`) the stub's own drafter, whose acceptance cycles 0..k. The verify
    budget is off: it would time the stub, whose step time means nothing."""
    from deepspec.decoding import build_drafter
    from service.worker.stub_target import StubDrafter, StubTarget

    declared = {} if settings.max_seq_len is None else {"max_seq_len": settings.max_seq_len}  # the stub's own
    target = StubTarget(step_delay_s=settings.stub_step_ms / 1000, **declared)
    if settings.draft in ("none", "prompt-lookup", "random"):
        drafter = build_drafter(settings.draft, target)
    else:
        drafter = StubDrafter()
    engine = SpecEngine(
        target,
        drafter,
        max_batch_size=settings.max_batch_size,
        max_seq_len=target.max_seq_len,
        num_speculative_tokens=settings.num_speculative_tokens,
    )
    return LoadedEngine(target, engine, "none" if drafter is None else drafter.name, engine.max_seq_len)
