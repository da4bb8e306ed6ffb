"""`--backend auto`, the worker's default: the first start exports an ONNX bundle into the cache, times the backends
and records the faster; later starts read the record; where ONNX cannot run, the PyTorch engine serves and the
reason says why; `--backend onnx` fails loudly instead of falling back. Real exports and timings of a tiny target."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("onnxruntime")

from deepspec.decoding import SpecEngine
from deepspec.decoding.verify_budget import modelled_tokens_per_second
from export.onnx.auto_quantization import AUTO_CANDIDATES
from service.worker import fastest_backend
from service.worker.fastest_backend import CHOICE_FILE, choose_backend, describe_cached_choice
from service.worker.settings import WorkerSettings
from tests.export.conftest import write_hf_target
from tests.neighbours import set_neighbours

HD16: dict[str, Any] = dict(hidden_size=64, head_dim=16, intermediate_size=128)
#: the engines auto weighs here: the PyTorch engine, the ONNX export and the native decoder (gcc is on CI's machine)
ENGINE_KINDS = ("pytorch", "onnx", "native")


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return write_hf_target(tmp_path_factory.mktemp("fastest") / "llama", "llama", **HD16)


@pytest.fixture(autouse=True)
def neighbours(monkeypatch):
    """Quiet unless a test says otherwise: whether a choice is cached must not depend on the machine's load."""
    return set_neighbours(monkeypatch, fastest_backend)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPSPEC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _settings(target_dir, **kw) -> WorkerSettings:
    return WorkerSettings(
        **{"target": str(target_dir), "draft": "prompt-lookup", "dtype": "float32", "backend": "auto", **kw}
    )


def test_the_modelled_throughput_is_the_best_depths_and_target_only_where_drafting_does_not_pay():
    steep = {1: 0.010, 8: 0.080}  # 8 tokens cost 8 steps: drafting never pays
    flat = {1: 0.010, 8: 0.012}
    assert modelled_tokens_per_second(steep, 3.0, 7) == pytest.approx(100.0)
    assert modelled_tokens_per_second(flat, 1.0, 7) == pytest.approx(100.0)  # no drafter: 1 token a step
    # tau 1 + 1/2 + ... + 1/2^7: each draft token accepted with probability 1/2; a round of d commits 2 - 2^-d
    tau = sum(0.5**j for j in range(8))
    want = max((2 - 0.5**d) / (0.010 + 0.002 * d / 7) for d in range(8))
    assert modelled_tokens_per_second(flat, tau, 7) == pytest.approx(want)
    assert modelled_tokens_per_second(flat, 3.0, 7) > modelled_tokens_per_second(flat, tau, 7) > 100.0


def test_the_first_start_measures_and_records_later_starts_read_the_record(target_dir, cache, monkeypatch):
    settings = _settings(target_dir)
    assert describe_cached_choice(settings) is None
    first = choose_backend(settings)
    record = json.loads(next(cache.glob(f"bundles/*/{CHOICE_FILE}")).read_text())
    assert first.backend == record["backend"] in ENGINE_KINDS
    measured = {k: r["tokens_per_second"] for k, r in record["decode_rates"].items()}  # the calibration decodes
    assert set(measured) == set(record["tokens_per_second"]) == set(ENGINE_KINDS)
    assert (
        first.backend == max(measured, key=lambda kind: measured[kind])
        and "decoded calibration prompts" in first.reason
    )
    assert set(record["step_curves"]) == set(ENGINE_KINDS) and record["acceptance_length"] == 2.0
    assert record["draft_rounds"] == dict.fromkeys(ENGINE_KINDS)  # prompt lookup: drafting priced as free
    assert (first.bundle_dir is not None) == (first.backend == "onnx")

    def no_work(*args, **kwargs):
        raise AssertionError("a cached choice measured or exported again")

    monkeypatch.setattr(fastest_backend, "measure_choice", no_work)
    monkeypatch.setattr("export.api.export_bundle", no_work)
    again = choose_backend(settings)
    assert (again.backend, again.bundle_dir) == (first.backend, first.bundle_dir)
    described = describe_cached_choice(settings)
    assert described is not None and first.backend in described and "cached in" in again.reason
    with pytest.raises(AssertionError):  # another draft depth is another choice: measured afresh
        choose_backend(_settings(target_dir, num_speculative_tokens=3))


def test_a_choice_measured_beside_busy_neighbours_is_measured_again(target_dir, cache, monkeypatch, neighbours):
    """A start beside a busy neighbour records a provisional choice; the next starts measure again (up to
    MAX_BUSY_ATTEMPTS busy measurements, then the last is kept), and one quiet measurement settles it."""
    settings = _settings(target_dir)
    measured = []
    real = fastest_backend.measure_choice
    monkeypatch.setattr(fastest_backend, "measure_choice", lambda *a, **k: measured.append(1) or real(*a, **k))
    neighbours.share = 0.6
    for _ in range(fastest_backend.MAX_BUSY_ATTEMPTS + 1):
        choose_backend(settings)
    record = json.loads(next(cache.glob(f"bundles/*/{CHOICE_FILE}")).read_text())
    assert len(measured) == fastest_backend.MAX_BUSY_ATTEMPTS  # the last start read the third busy record
    assert record["provisional"] and record["attempts"] == fastest_backend.MAX_BUSY_ATTEMPTS
    assert record["neighbour_share"] == 0.6
    (next(cache.glob(f"bundles/*/{CHOICE_FILE}"))).unlink()
    neighbours.share = 0.6
    choose_backend(settings)  # busy: provisional
    neighbours.share = 0.05
    choose_backend(settings)  # quiet: measured again, and settled
    choose_backend(settings)
    assert len(measured) == fastest_backend.MAX_BUSY_ATTEMPTS + 2
    assert json.loads(next(cache.glob(f"bundles/*/{CHOICE_FILE}")).read_text())["provisional"] is False


#: made-up verify-step curves (seconds by T): the PyTorch engine's 1-token step cheaper, ONNX's verify pass flatter,
#: the native decoder's dearer than both throughout (so it never wins here)
FAKE_CURVES = {
    "pytorch": {1: 0.005, 2: 0.006, 4: 0.008, 8: 0.015, 16: 0.030, 32: 0.060},
    "onnx": {1: 0.006, 2: 0.0062, 4: 0.0065, 8: 0.007, 16: 0.012, 32: 0.022},
    "native": {1: 0.007, 2: 0.0075, 4: 0.0085, 8: 0.016, 16: 0.031, 32: 0.061},
}


@pytest.mark.parametrize("round_ms, winner", [(0.0, "onnx"), (4.0, "pytorch")])
def test_a_neural_drafts_round_on_each_engine_is_recorded_and_scored(tmp_path, cache, monkeypatch, round_ms, winner):
    """The DSpark draft is timed on each engine as that engine runs it (made-up timings and curves). Free, it makes
    the flat ONNX curve win at τ 2; at 4 ms a round drafting no longer pays on the PyTorch curve, whose 1-token step
    (200 tokens/s) then beats ONNX's best with drafting (5 drafts, 184). Both costs go into choice.json."""
    import deepspec.decoding.draft_time as draft_time
    import deepspec.models.step_curve as step_curve
    import export.onnx.decode_rate as decode_rate
    from deepspec.decoding.drafters.onnx_graphs import OnnxDraftModel
    from deepspec.decoding.verify_budget import DraftTimeModel
    from deepspec.models.native import NativeTarget
    from deepspec.models.onnx_target import OnnxTarget
    from tests.export.conftest import write_draft

    def engine_of(target) -> str:
        return "onnx" if isinstance(target, OnnxTarget) else "native" if isinstance(target, NativeTarget) else "pytorch"

    timed = []

    def fake_measure(target, drafter, depth):
        assert isinstance(drafter.model, OnnxDraftModel) == (engine_of(target) == "onnx")  # as that engine runs it
        timed.append(engine_of(target))
        return DraftTimeModel({(1, 1): round_ms / 1e3, (1, depth): round_ms / 1e3})

    monkeypatch.setattr(draft_time, "measure_draft_time", fake_measure)
    monkeypatch.setattr(step_curve, "measure_recorded_curve", lambda target: FAKE_CURVES[engine_of(target)])
    monkeypatch.setattr(decode_rate, "measure_served_rates", lambda *args: None)  # the model decides
    tied = write_hf_target(tmp_path / "llama", "llama", tied=True, **HD16)  # a draft reads the fp32 embedding
    draft = write_draft(tmp_path / "dspark", tied, "dspark")
    choice = choose_backend(_settings(tied, draft=str(draft)))
    record = json.loads(next(cache.glob(f"bundles/*/{CHOICE_FILE}")).read_text())
    assert record["version"] == fastest_backend.CHOICE_VERSION and choice.backend == record["backend"] == winner
    assert {k: r["ms"] for k, r in record["draft_rounds"].items()} == {
        k: {"1": round_ms, "7": round_ms} for k in ENGINE_KINDS
    }
    cost = DraftTimeModel({(1, 1): round_ms / 1e3, (1, 7): round_ms / 1e3})
    assert record["tokens_per_second"] == {
        k: round(modelled_tokens_per_second(c, 2.0, 7, cost), 1) for k, c in FAKE_CURVES.items()
    }
    assert "ms a round" in record["reason"]
    # the ONNX draft was timed by the export's own choice, once per candidate format, and the worker reused it
    assert sorted(timed) == sorted(["onnx"] * len(AUTO_CANDIDATES) + ["pytorch", "native"])


def test_the_engine_that_decodes_fastest_is_chosen_over_the_best_modelled(target_dir, cache, monkeypatch):
    """The calibration decodes decide where there are any: here the model's favourite measures slowest."""
    import export.onnx.decode_rate as decode_rate

    rates = {"pytorch": 30.0, "onnx": 90.0, "native": 60.0, "int4": 50.0, "int8": 40.0}  # the export's too

    def measured(candidates, depth, *rest):
        assert all(t is not None for t, _ in candidates.values())
        return {name: {"tokens_per_second": rates[name], "acceptance_length": None} for name in candidates}

    monkeypatch.setattr(decode_rate, "measure_served_rates", measured)
    choice = choose_backend(_settings(target_dir, num_speculative_tokens=2))
    assert (
        choice.backend == "onnx"
        and choice.reason.startswith("ONNX ")
        and "decoded calibration prompts at 90" in choice.reason
        and "PyTorch float32's 30 and native int8" in choice.reason
    )


def _no_work(*args, **kwargs):
    raise AssertionError("measured or exported where nothing was to be")


def test_a_weight_format_only_pytorch_honours_is_served_unmeasured(target_dir, cache, monkeypatch):
    """--quantization gguf with --backend auto: the PyTorch decoder is the only backend that takes it, so it is
    served without a measurement, an export or a cache entry, and the reason (and --help's line) says why."""
    monkeypatch.setattr(fastest_backend, "measure_choice", _no_work)
    monkeypatch.setattr("export.api.export_bundle", _no_work)
    settings = _settings(target_dir, quantization="gguf")
    choice = choose_backend(settings)
    assert choice.backend == "pytorch"
    assert choice.reason == "--quantization gguf: the only backend that honours it, served without measuring"
    assert describe_cached_choice(settings) == f"pytorch: {choice.reason}"
    assert not cache.exists() or not list(cache.glob("bundles/*"))


@pytest.mark.parametrize("weights, native_layers", [("int8", "int8"), ("int4", "q4")])
def test_auto_weighs_only_the_backends_that_honour_the_weight_format_each_in_it(
    target_dir, cache, monkeypatch, weights, native_layers
):
    """--quantization int8 / int4 with --backend auto: the ONNX export (made in that format) and the native decoder
    (its layers in it: int4 = its 4-bit blocks, where its auto keeps this float target on int8) are measured; the
    PyTorch decoder, which takes neither, is not even loaded. The choice is cached under the format."""
    import export.onnx.decode_rate as decode_rate
    from deepspec.models.native import NativeTarget
    from deepspec.models.onnx_target import OnnxTarget

    weighed = {}

    def measured(candidates, depth, *rest):
        weighed.update({name: target for name, (target, _) in candidates.items()})
        rates = {"onnx": 50.0, "native": 70.0}
        return {name: {"tokens_per_second": rates[name], "acceptance_length": None} for name in candidates}

    monkeypatch.setattr(decode_rate, "measure_served_rates", measured)
    settings = _settings(target_dir, quantization=weights, num_speculative_tokens=2)
    choice = choose_backend(settings)
    assert set(weighed) == {"onnx", "native"}
    assert isinstance(weighed["onnx"], OnnxTarget) and isinstance(weighed["native"], NativeTarget)
    assert weighed["native"].quantization == native_layers
    record = json.loads((fastest_backend.bundle_cache_dir(settings) / CHOICE_FILE).read_text())
    assert record["onnx_quantization"] == weights and set(record["step_curves"]) == {"onnx", "native"}
    assert choice.backend == "native" and f"against ONNX {weights}'s 50" in choice.reason
    assert fastest_backend.cache_key(settings)["quantization"] == weights
    monkeypatch.setattr(fastest_backend, "measure_choice", _no_work)
    again = choose_backend(settings)
    assert again.backend == "native" and "cached in" in again.reason


def test_the_worker_serves_an_auto_choice_in_the_weight_format_given(target_dir, cache, monkeypatch):
    """--quantization int8 with --backend auto, the ONNX export measured fastest: the worker loads that bundle
    (exported in int8, which its loader checks against the format asked for) and decodes with it."""
    import export.onnx.decode_rate as decode_rate
    from deepspec.decoding import SamplingParams
    from deepspec.models.onnx_target import OnnxTarget
    from service.worker.engine import load_engine

    def measured(candidates, depth, *rest):
        rates = {"onnx": 90.0, "native": 10.0}
        return {name: {"tokens_per_second": rates[name], "acceptance_length": None} for name in candidates}

    monkeypatch.setattr(decode_rate, "measure_served_rates", measured)
    loaded = load_engine(_settings(target_dir, quantization="int8", max_seq_len=64, max_batch_size=1))
    assert isinstance(loaded.target, OnnxTarget) and loaded.backend_choice.startswith("onnx: ONNX int8 decoded")
    assert len(loaded.engine.generate([[1, 40, 41, 42]], SamplingParams(max_tokens=4))[0].token_ids) == 4


def test_a_weight_format_whose_backends_cannot_run_is_refused_or_served_by_the_one_that_can(
    target_dir, cache, monkeypatch
):
    with pytest.raises(ValueError, match=r"none of the backends that honour --quantization int8 can run here \(onnx"):
        choose_backend(_settings(target_dir, quantization="int8", device="cuda"))
    monkeypatch.setattr(fastest_backend, "onnx_blocker", lambda settings: "onnxruntime is not installed")
    monkeypatch.setattr(fastest_backend, "measure_choice", _no_work)
    choice = choose_backend(_settings(target_dir, quantization="int4"))
    assert choice.backend == "native"
    assert choice.reason == (
        "the other backends that honour --quantization int4 cannot run here (onnx: onnxruntime is not installed)"
    )


def test_engine_onnx_serves_the_cached_export_through_the_worker(target_dir, cache):
    from deepspec.decoding import SamplingParams
    from deepspec.models.onnx_target import OnnxTarget
    from service.worker.engine import load_engine

    loaded = load_engine(_settings(target_dir, backend="onnx", max_seq_len=64, max_batch_size=1))
    assert isinstance(loaded.target, OnnxTarget) and loaded.backend_choice.startswith("onnx")
    assert loaded.drafter_name == "prompt-lookup"
    out = loaded.engine.generate([[1, 40, 41, 42]], SamplingParams(max_tokens=4))[0]
    assert len(out.token_ids) == 4
    assert not list(cache.glob(f"bundles/*/{CHOICE_FILE}"))  # nothing was measured for an explicit choice


def test_engine_native_serves_the_native_decoder_through_the_worker(target_dir, cache):
    from deepspec.decoding import SamplingParams
    from deepspec.models.native import NativeTarget
    from service.worker.engine import load_engine

    loaded = load_engine(_settings(target_dir, backend="native", max_seq_len=64, max_batch_size=2))
    assert isinstance(loaded.target, NativeTarget) and loaded.backend_choice == "native: --backend native"
    prompts = [[1, 40, 41, 42, 40, 41], [1, 50, 51]]
    drafted = loaded.engine.generate(prompts, SamplingParams(max_tokens=12))
    alone = SpecEngine(loaded.target, None, max_batch_size=1, max_seq_len=64)
    assert [r.token_ids for r in drafted] == [
        alone.generate([p], SamplingParams(max_tokens=12))[0].token_ids for p in prompts
    ]  # speculation is exact on it, at batch 2 too
    assert not list(cache.glob(f"bundles/*/{CHOICE_FILE}"))


def test_without_a_compiler_auto_leaves_native_out_and_native_refuses(target_dir, cache, monkeypatch, tmp_path):
    from deepspec.models.native import build

    monkeypatch.setattr(build, "_LIBRARY", None)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(ValueError, match="--backend native: CC=.*no-such-cc is not an executable C compiler"):
        choose_backend(_settings(target_dir, backend="native"))
    choose_backend(_settings(target_dir))
    record = json.loads(next(cache.glob(f"bundles/*/{CHOICE_FILE}")).read_text())
    assert set(record["step_curves"]) == {"pytorch", "onnx"}


def test_where_onnx_cannot_run_auto_keeps_pytorch_and_onnx_refuses(target_dir, cache, monkeypatch):
    choice = choose_backend(_settings(target_dir, device="cuda"))
    assert choice.backend == "pytorch" and "CPU only" in choice.reason
    with pytest.raises(ValueError, match="--backend onnx: it runs on CPU only"):
        choose_backend(_settings(target_dir, backend="onnx", device="cuda"))
    with pytest.raises(ValueError, match="--backend native: it runs on CPU only"):
        choose_backend(_settings(target_dir, backend="native", device="cuda"))
    assert choose_backend(_settings(target_dir, backend="pytorch")).reason == "--backend pytorch"
    assert not cache.exists() or not list(cache.glob("bundles/*"))


def test_a_failed_export_falls_back_to_pytorch_and_leaves_no_half_export(target_dir, cache, monkeypatch, tmp_path):
    bad = tmp_path / "not-a-draft"
    bad.mkdir()
    (bad / "config.json").write_text('{"algo": "no-such-algorithm"}')
    choice = choose_backend(_settings(target_dir, draft=str(bad)))
    assert choice.backend == "pytorch" and "could not be prepared" in choice.reason
    assert not list(cache.glob("bundles/*/onnx/manifest.json")) and not list(cache.glob(f"bundles/*/{CHOICE_FILE}"))
    with pytest.raises(RuntimeError, match="the ONNX export for .* failed: draft .* does not match target"):
        choose_backend(_settings(target_dir, draft=str(bad), backend="onnx"))


def test_help_says_what_auto_serves_here(target_dir, cache, monkeypatch):
    from service.cli import _backend_choice_line

    assert "first start measures it" in _backend_choice_line()
    monkeypatch.setenv("DEEPSPEC_WORKER_TARGET", str(target_dir))
    monkeypatch.setenv("DEEPSPEC_WORKER_DRAFT", "prompt-lookup")
    monkeypatch.setenv("DEEPSPEC_WORKER_DTYPE", "float32")
    monkeypatch.setenv("DEEPSPEC_WORKER_BACKEND", "auto")
    chosen = choose_backend(_settings(target_dir))
    assert _backend_choice_line().startswith(f"On this machine, for the default target and draft: {chosen.backend}:")


def _cache_entry(choice) -> Path:
    """The cache folder that holds an ONNX choice's bundle."""
    assert choice.bundle_dir is not None, choice
    return choice.bundle_dir.parent


def test_an_upgrade_replaces_its_superseded_cache_entry_and_keeps_other_settings(target_dir, cache, monkeypatch):
    old_root = _cache_entry(choose_backend(_settings(target_dir, backend="onnx")))
    other = _cache_entry(choose_backend(_settings(target_dir, backend="onnx", num_speculative_tokens=3)))
    real_key = fastest_backend.cache_key
    monkeypatch.setattr(
        fastest_backend, "cache_key", lambda s: {**real_key(s), "versions": {"deepspec": "next release"}}
    )
    upgraded = _cache_entry(choose_backend(_settings(target_dir, backend="onnx")))
    assert upgraded != old_root and not old_root.exists()  # the same settings after an upgrade: replaced
    assert other.exists()  # other settings are another entry, kept


def test_an_older_releases_engines_folder_is_neither_read_nor_touched(target_dir, cache):
    """Releases before the bundle vocabulary cached their exports under `<cache>/engines/`: a worker reuses nothing
    there (the CHANGELOG says it can be deleted) and exports again under `<cache>/bundles/`."""
    settings = _settings(target_dir, backend="onnx")
    root = fastest_backend.bundle_cache_dir(settings)
    assert root.parent == cache / "bundles"
    stale = cache / "engines" / root.name
    (stale / "onnx").mkdir(parents=True)
    (stale / "onnx" / "manifest.json").write_text("{}")
    (stale / "key.json").write_text(json.dumps(fastest_backend.cache_key(settings)))
    choice = choose_backend(settings)
    assert choice.bundle_dir is not None and choice.bundle_dir.is_relative_to(cache / "bundles")
    assert (stale / "onnx" / "manifest.json").read_text() == "{}"
