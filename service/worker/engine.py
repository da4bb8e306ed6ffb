"""Build the engine a worker hosts: the real `deepspec` SpecEngine, or the stub (`--target stub`) for tests/benchmarks."""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass
class LoadedEngine:
    target: object
    engine: object
    #: the drafter's registry name, "none" without one
    drafter_name: str
    max_seq_len: int


def load_engine(settings) -> LoadedEngine:
    """Load weights and build the engine (blocking: seconds for the default target on CPU)."""
    if settings.target == "stub":
        from service.worker.stub_engine import StubEngine, StubTarget

        target = StubTarget(max_seq_len=settings.max_seq_len)
        drafter = None if settings.draft == "none" else "stub-drafter"
        engine = StubEngine(target, drafter, max_batch_size=settings.max_batch_size,
                            max_seq_len=settings.max_seq_len, num_speculative_tokens=settings.num_speculative_tokens,
                            step_delay_s=settings.stub_step_ms / 1000)  # fmt: skip
        return LoadedEngine(target, engine, "none" if drafter is None else drafter, engine.max_seq_len)

    from deepspec.decoding import SpecEngine, build_drafter
    from deepspec.models import load_target

    target = load_target(settings.target, dtype=settings.dtype, device=settings.device,
                         quantization=settings.quantization)
    drafter = build_drafter(settings.draft, target)
    max_seq_len = min(settings.max_seq_len, target.max_seq_len)
    engine = SpecEngine(target, drafter, max_batch_size=settings.max_batch_size, max_seq_len=max_seq_len,
                        num_speculative_tokens=settings.num_speculative_tokens)  # fmt: skip
    drafter_name = "none" if drafter is None else getattr(drafter, "name", type(drafter).__name__)
    logger.info("loaded target %s (quantization %s) with drafter %s (context %d tokens)", target.name,
                target.quantization, drafter_name, max_seq_len)
    if engine.step_time is not None:
        logger.info("verification budget on: probed %s", engine.step_time)
    return LoadedEngine(target, engine, drafter_name, max_seq_len)
