"""The speculative decoding engine and its drafters."""

from deepspec.decoding.batch_state import BatchView
from deepspec.decoding.drafter import Drafter, DraftSampling, KVDrafter, PaddedProposal, Proposal
from deepspec.decoding.engine import EngineFullError, SpecEngine
from deepspec.decoding.params import GenerationResult, SamplingParams, StepOutput
from deepspec.decoding.registry import (
    available_drafters,
    build_drafter,
    load_checkpoint_drafter,
    register_checkpoint_algo,
    register_drafter,
    resolve_checkpoint_algo,
    resolve_drafter,
)
from deepspec.decoding.validation import RequestError, RequestErrorCode

__all__ = [
    "BatchView",
    "DraftSampling",
    "Drafter",
    "EngineFullError",
    "GenerationResult",
    "KVDrafter",
    "PaddedProposal",
    "Proposal",
    "RequestError",
    "RequestErrorCode",
    "SamplingParams",
    "SpecEngine",
    "StepOutput",
    "available_drafters",
    "build_drafter",
    "load_checkpoint_drafter",
    "register_checkpoint_algo",
    "register_drafter",
    "resolve_checkpoint_algo",
    "resolve_drafter",
]
