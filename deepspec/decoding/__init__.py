"""The speculative decoding engine and its drafters."""

from deepspec.decoding.drafter import DraftSampling, Drafter, Proposal
from deepspec.decoding.engine import EngineFullError, SpecEngine
from deepspec.decoding.params import GenerationResult, SamplingParams, StepOutput
from deepspec.decoding.registry import available_drafters, build_drafter, register_checkpoint_loader, register_drafter

__all__ = [
    "DraftSampling", "Drafter", "EngineFullError", "GenerationResult", "Proposal", "SamplingParams", "SpecEngine",
    "StepOutput", "available_drafters", "build_drafter", "register_checkpoint_loader", "register_drafter",
]
