"""The served context (issue 43 item 9): the target's declared context by default, not a fixed 2,048; lowered with
a logged reason where the KV cache of every batch slot would not fit in memory; an explicit --max-seq-len the target
or the memory cannot hold is refused. Each backend's cache is sized from its own layout."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from service.worker import context as ctx
from service.worker.context import CONTEXT_GRANULE, kv_bytes_per_position, served_context
from service.worker.settings import WorkerSettings
from tests.export.conftest import write_hf_target

GIB = 1024**3
#: the default SmolLM2-135M: 30 layers × 3 KV heads × 64 dims, K and V
SMOLLM2_VALUES_PER_POSITION = 30 * 3 * 64 * 2


def _context(
    declared=8192,
    requested=None,
    *,
    slots=8,
    slack=9,
    per_position=2 * SMOLLM2_VALUES_PER_POSITION,
    available: int | None = 16 * GIB,
    fraction=0.5,
):
    return served_context(
        declared,
        requested,
        slots=slots,
        slack=slack,
        bytes_per_position=per_position,
        available_bytes=available,
        memory_fraction=fraction,
    )


def test_the_declared_context_is_served_where_it_fits():
    served = _context()  # float16 cache, 8 slots × 8,201 positions: 1.4 GiB of 8 GiB
    assert served.tokens == 8192 and "declares" in served.reason and "1.41 GiB" in served.reason
    assert _context(requested=3000).tokens == 3000


def test_a_context_that_does_not_fit_is_lowered_to_what_fits_with_the_reason():
    served = _context(available=1 * GIB)  # 0.5 GiB for 8 slots of 23 KiB a position: 2,840 positions
    assert served.tokens % CONTEXT_GRANULE == 0 and 2048 <= served.tokens < 8192
    assert served.tokens + 9 <= (GIB // 2) // (8 * 2 * SMOLLM2_VALUES_PER_POSITION)
    assert served.reason.startswith("lowered from the 8192 tokens")
    assert "--max-batch-size" in served.reason and "--kv-cache-memory-fraction" in served.reason
    assert _context(available=1 * GIB, slots=1).tokens == 8192  # one slot fits: the batch size decides


def test_an_explicit_length_the_target_or_the_memory_cannot_hold_is_refused():
    with pytest.raises(ValueError, match="exceeds the 8192 tokens the target declares"):
        _context(requested=16384)
    with pytest.raises(ValueError, match="does not fit in memory.*--kv-cache-memory-fraction"):
        _context(requested=8192, available=1 * GIB)
    with pytest.raises(ValueError, match="not even 256 tokens"):
        _context(available=10 * 2**20)


def test_unknown_memory_leaves_the_declared_context():
    assert _context(available=None).tokens == 8192


def test_the_cgroup_limit_bounds_the_memory(tmp_path, monkeypatch):
    (tmp_path / "memory.max").write_text("3221225472\n")
    (tmp_path / "memory.current").write_text("1073741824\n")
    assert ctx._cgroup_headroom(tmp_path) == 2 * GIB
    (tmp_path / "memory.max").write_text("max\n")
    assert ctx._cgroup_headroom(tmp_path) is None
    assert ctx._cgroup_headroom(tmp_path / "absent") is None
    monkeypatch.setattr(ctx, "_cgroup_headroom", lambda: GIB)
    available = ctx.available_memory_bytes("cpu")
    assert available is not None and available <= GIB


# --- each backend, on a tiny target that declares 4,096 positions ---------------------------------------------------

DECLARED = 4096
HD16: dict[str, Any] = dict(
    hidden_size=64,
    head_dim=16,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=DECLARED,
)
#: values a position takes in the tiny target's cache: 2 layers × 2 KV heads × 16 dims, K and V
TINY_VALUES = 2 * 2 * 16 * 2


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return write_hf_target(tmp_path_factory.mktemp("context") / "llama", "llama", **HD16)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPSPEC_CACHE_DIR", str(tmp_path / "cache"))


def _settings(target_dir, engine, **kw) -> WorkerSettings:
    return WorkerSettings(target=str(target_dir), draft="prompt-lookup", dtype="float32", backend=engine, **kw)


@pytest.mark.parametrize("engine, element_bytes", [("pytorch", 4), ("native", 2), ("onnx", 4)])
def test_each_backend_serves_the_declared_context_and_a_prompt_past_2048(target_dir, cache, engine, element_bytes):
    """A 3,500-token prompt (the issue's 400 under the old fixed 2,048) is served by every backend at batch 8."""
    if engine == "onnx":
        pytest.importorskip("onnxruntime")
    from deepspec.decoding import SamplingParams
    from service.worker.engine import load_engine

    loaded = load_engine(_settings(target_dir, engine, max_batch_size=8))
    assert kv_bytes_per_position(loaded.target) == TINY_VALUES * element_bytes
    assert loaded.max_seq_len == loaded.engine.max_seq_len == loaded.target.max_seq_len == DECLARED
    prompt = [5 + i % 90 for i in range(3500)]
    out = loaded.engine.generate([prompt], SamplingParams(max_tokens=4, temperature=0.0))[0]
    assert len(out.token_ids) == 4


def test_the_planner_setting_picks_how_deep_rounds_verify(target_dir, cache):
    """`--planner verify-all` verifies every proposed token (bench.qps_ladder's "always on" row); the default prices
    depths on the step curve."""
    from deepspec.decoding.planner import BudgetPlanner, RoundPlanner
    from service.worker.engine import load_engine

    served = load_engine(_settings(target_dir, "pytorch"))
    verify_all = load_engine(_settings(target_dir, "pytorch", planner="verify-all"))
    assert isinstance(served.engine.planner, BudgetPlanner)
    assert type(verify_all.engine.planner) is RoundPlanner
    with pytest.raises(ValueError, match="planner"):
        _settings(target_dir, "pytorch", planner="always")


def test_a_worker_short_of_memory_serves_less_and_says_why(target_dir, cache, monkeypatch, caplog):
    from service.worker.engine import load_engine

    per_token = 8 * TINY_VALUES * 4  # 8 slots, float32
    monkeypatch.setattr(ctx, "available_memory_bytes", lambda device: 2 * per_token * 1500)  # half: 1,500 positions
    with caplog.at_level(logging.WARNING, logger="service.worker.context"):
        loaded = load_engine(_settings(target_dir, "pytorch", max_batch_size=8))
    assert loaded.max_seq_len == 1280  # (1,500 - slack) rounded down to 256
    assert "lowered from the 4096 tokens" in caplog.text
    with pytest.raises(ValueError, match="--max-seq-len 4096 does not fit in memory"):
        load_engine(_settings(target_dir, "pytorch", max_batch_size=8, max_seq_len=4096))
    with pytest.raises(ValueError, match="exceeds the 4096 tokens"):
        load_engine(_settings(target_dir, "pytorch", max_seq_len=5000))


@pytest.mark.slow
@pytest.mark.parametrize("engine, element_bytes", [("native", 2), ("pytorch", 4)])
def test_the_default_target_serves_its_declared_8192_and_a_3500_token_prompt(engine, element_bytes):
    """The default SmolLM2 GGUF declares 8,192 positions; at batch 8 its cache fits (native float16: 1.4 GiB; the
    PyTorch target keeps float32 attention under bf16 weights: 2.8 GiB) and a 3,500-token prompt is served."""
    from deepspec.decoding import SamplingParams
    from service.worker.engine import load_engine

    loaded = load_engine(WorkerSettings(backend=engine, draft="none", max_batch_size=8))
    assert loaded.max_seq_len == 8192
    assert kv_bytes_per_position(loaded.target) == SMOLLM2_VALUES_PER_POSITION * element_bytes
    text = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n" * 300
    prompt = loaded.target.encode(text)[:3500]
    assert len(prompt) == 3500
    out = loaded.engine.generate([prompt], SamplingParams(max_tokens=8, temperature=0.0))[0]
    assert len(out.token_ids) == 8
