"""Shared fixtures: a tiny random-init target (milliseconds per step) and the real default target."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pytest
import torch

from deepspec.paths import datasets_dir

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Workers started by the tests (in process or as `python -m service worker` children, which inherit this) serve the
# PyTorch backend: the tests pin what they check against it (tree attention, bf16 tolerances, float32 identity). The
# default `--backend auto` is tested on its own (tests/service/test_fastest_backend.py), in a cache of its own.
os.environ.setdefault("DEEPSPEC_WORKER_BACKEND", "pytorch")


class CharTokenizer:
    """Token i decodes to one printable character; enough for the engine's detokenizer in unit tests."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self.eos_token_id = vocab_size - 1

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(33 + i) for i in ids if not (skip_special_tokens and i == self.eos_token_id))


def make_tiny_target(
    vocab_size: int = 16, hidden: int = 32, layers: int = 2, seed: int = 0, eos: bool = True, temperature: float = 1.0
):
    """A random-init Llama built by transformers, run by our Decoder; returns (DecoderTarget, hf_model)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from deepspec.models.arch import arch_spec_from_config
    from deepspec.models.decoder import Decoder
    from deepspec.models.decoder_target import DecoderTarget

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    hf = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # sharpen or flatten the distribution so tests can pick how peaky sampling is
        hf.lm_head.weight.mul_(temperature)
    spec = arch_spec_from_config(config)
    model = Decoder(spec, max_positions=256)
    model.load_hf_state_dict(hf.state_dict(), torch.float32)
    tokenizer = CharTokenizer(vocab_size)
    eos_ids = (tokenizer.eos_token_id,) if eos else ()
    # a stand-in for a transformers tokenizer: the engine's detokenizer calls decode() and reads eos_token_id
    hf_tokenizer = cast("PreTrainedTokenizerBase", tokenizer)
    return DecoderTarget("tiny", Path("."), config, spec, model.eval(), hf_tokenizer, 256, eos_ids), hf


def pytest_runtest_logreport(report):
    """With DEEPSPEC_TEST_TIMINGS=<file>, append one line per test phase as it ends (`seconds outcome when nodeid`,
    each xdist worker included): a run cut short by a timeout still says which tests were slow or failed."""
    path = os.environ.get("DEEPSPEC_TEST_TIMINGS")
    if hasattr(report, "node"):  # under xdist, the controller's copy of a worker's report: the worker wrote it
        return
    if path and (report.when == "call" or report.outcome != "passed" or report.duration > 1.0):
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(path, "a") as f:
            f.write(
                f"{report.duration:9.2f} {report.outcome:8} {report.when:8} {worker:5} {time.strftime('%H:%M:%S')} "
                f"{report.nodeid}\n"
            )


@pytest.fixture(scope="session")
def tiny_target():
    return make_tiny_target()


@pytest.fixture(scope="session")
def smollm2():
    """The real default target in fp32 (dequantized once into ~/.cache/deepspec)."""
    from deepspec.models import load_target

    return load_target("smollm2-135m", dtype="float32")


def eval_prompts(name: str, count: int) -> list[str]:
    path = datasets_dir() / "eval" / f"{name}.jsonl"
    with path.open() as f:
        return [json.loads(line)["turns"][0] for _, line in zip(range(count), f)]
