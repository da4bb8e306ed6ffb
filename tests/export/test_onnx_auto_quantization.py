"""`--quantization auto`: each candidate format is exported and timed here, the one with the highest modelled
throughput at the draft's acceptance length is kept (one weight format for the whole run), and its step curve
goes into onnx.json, where the engine's verification budget reads it instead of probing."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import onnx

from deepspec.decoding.verify_budget import (
    DraftTimeModel,
    modelled_tokens_per_second,
)
from deepspec.models import load_target
from deepspec.models.onnx_target import OnnxTarget
from deepspec.models.step_curve import curve_record, machine_key
from export.onnx.auto_quantization import AUTO_CANDIDATES, STAGING
from export.onnx.graph import LINEAR_KERNELS
from tests.export.conftest import HD16, run_export, write_draft, write_hf_target

#: made-up curves (seconds by T): int4 has the cheaper 1-token step, int8 the flatter multi-token one
FAKE_CURVES = {
    "int4": {1: 0.005, 2: 0.006, 4: 0.008, 8: 0.015, 16: 0.030, 32: 0.060},
    "int8": {1: 0.006, 2: 0.0062, 4: 0.0065, 8: 0.007, 16: 0.012, 32: 0.022},
}


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return write_hf_target(tmp_path_factory.mktemp("auto") / "llama", "llama", **HD16)


def _graph_ops(out) -> set[str]:
    return {n.op_type for n in onnx.load(out / "target.onnx", load_external_data=False).graph.node}


def _fake_timing(monkeypatch, tmp_path):
    """record_step_curve returns FAKE_CURVES[the graph's quantization] instead of timing it, and there are no
    calibration prompts (an empty datasets folder): the modelled throughput decides."""
    import export.onnx.exporter as exporter

    def fake(out):
        return curve_record(FAKE_CURVES[json.loads((out / "onnx.json").read_text())["quantization"]])

    monkeypatch.setattr(exporter, "record_step_curve", fake)
    (tmp_path / "no-datasets").mkdir()
    monkeypatch.setenv("DEEPSPEC_DATASETS_DIR", str(tmp_path / "no-datasets"))


def test_auto_exports_every_candidate_and_keeps_the_fastest_measured_here(target_dir, tmp_path):
    out = tmp_path / "engine"
    result = run_export(
        "--format", "onnx", "--quantization", "auto", "--target", target_dir, "--draft", "none", "--out", out
    )
    assert result.returncode == 0, result.stderr
    meta = json.loads((out / "onnx.json").read_text())
    choice = meta["quantization_choice"]
    assert set(choice["candidates"]) == set(AUTO_CANDIDATES) and choice["acceptance_length"] == 1.0
    scores = {q: c["tokens_per_second"] for q, c in choice["candidates"].items()}
    assert choice["chosen"] == meta["quantization"] == max(AUTO_CANDIDATES, key=lambda q: scores[q])
    assert LINEAR_KERNELS[meta["quantization"]] in _graph_ops(out)  # the kept graph is the chosen one
    assert not (out / STAGING).exists() and len(list(out.glob("*.onnx.data"))) == 1
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["onnx"]["quantization"] == meta["quantization"]
    assert manifest["onnx"]["step_curve"]["machine"] == machine_key()
    assert load_target(str(out)).recorded_step_curve() is not None
    # measured: each candidate decoded the calibration prompts (target-only here: no τ)
    assert choice["rule"].startswith("highest tokens/s decoding")
    assert all(
        c["tokens_per_second"] > 0 and c["measured_acceptance_length"] is None and c["modelled_tokens_per_second"] > 0
        for c in choice["candidates"].values()
    )


@pytest.mark.parametrize("draft, winner", [("none", "int4"), ("prompt-lookup", "int8")])
def test_the_choice_weighs_the_multi_token_step_by_the_drafts_acceptance(
    target_dir, tmp_path, monkeypatch, draft, winner
):
    """Target-only (τ 1) needs the cheaper 1-token step (int4's); with a drafter (nominal τ 2) the flat verify pass
    wins (int8's 2 tokens in 7 ms beat int4's 1 in 5 ms)."""
    _fake_timing(monkeypatch, tmp_path)
    out = tmp_path / "engine"
    assert (
        run_export(
            "--format", "onnx", "--quantization", "auto", "--target", target_dir, "--draft", draft, "--out", out
        ).returncode
        == 0
    )
    meta = json.loads((out / "onnx.json").read_text())
    assert meta["quantization"] == winner and LINEAR_KERNELS[winner] in _graph_ops(out)
    tau = meta["quantization_choice"]["acceptance_length"]
    want = {q: round(modelled_tokens_per_second(c, tau, 7), 1) for q, c in FAKE_CURVES.items()}
    assert {q: c["tokens_per_second"] for q, c in meta["quantization_choice"]["candidates"].items()} == want
    assert all(c["draft_round"] is None for c in meta["quantization_choice"]["candidates"].values())  # no model


def test_a_neural_drafts_round_on_each_candidate_is_priced_into_its_score(tmp_path, monkeypatch):
    """The DSpark draft timed on each candidate's own draft graphs (made-up timings: 3 ms a round on int4, 4 ms on
    int8): at τ 2 drafting no longer pays on int4's steep curve, whose 1-token step (200 tokens/s) now beats the
    flat int8 curve that wins when drafting is free (test above, prompt lookup). Each candidate records its cost."""
    import deepspec.decoding.draft_time as draft_time
    from deepspec.decoding.drafters.onnx_graphs import OnnxDraftModel

    _fake_timing(monkeypatch, tmp_path)
    round_ms = {"int4": 3.0, "int8": 4.0}
    probed = []

    def fake_measure(target, drafter, depth):
        assert isinstance(drafter.model, OnnxDraftModel)  # the draft as this candidate's export runs it
        probed.append(target.meta["quantization"])
        ms = round_ms[target.meta["quantization"]]
        return DraftTimeModel({(1, 1): ms / 1e3, (1, depth): ms / 1e3})

    monkeypatch.setattr(draft_time, "measure_draft_time", fake_measure)
    tied = write_hf_target(tmp_path / "llama", "llama", tied=True, **HD16)  # a draft reads the fp32 embedding
    draft = write_draft(tmp_path / "dspark", tied, "dspark")
    out = tmp_path / "engine"
    result = run_export("--format", "onnx", "--quantization", "auto", "--target", tied, "--draft", draft, "--out", out)
    assert result.returncode == 0, result.stderr
    choice = json.loads((out / "onnx.json").read_text())["quantization_choice"]
    assert probed == list(AUTO_CANDIDATES) and choice["chosen"] == "int4" and choice["acceptance_length"] == 2.0
    for quant, candidate in choice["candidates"].items():
        assert candidate["draft_round"] == curve_record({1: round_ms[quant] / 1e3, 7: round_ms[quant] / 1e3})
        cost = DraftTimeModel({(1, 1): round_ms[quant] / 1e3, (1, 7): round_ms[quant] / 1e3})
        assert candidate["tokens_per_second"] == round(modelled_tokens_per_second(FAKE_CURVES[quant], 2.0, 7, cost), 1)
    assert choice["candidates"]["int4"]["tokens_per_second"] == 200.0


def test_a_measured_decode_rate_outvotes_the_model(target_dir, tmp_path, monkeypatch):
    """With calibration prompts, the candidates' measured decode rates decide, not the model: the fake curves model
    int8 ahead with prompt lookup (test above), a measured int4 twice as fast is kept; each candidate records both
    numbers and its measured τ."""
    import export.onnx.decode_rate as decode_rate
    import export.onnx.exporter as exporter

    monkeypatch.setattr(
        exporter,
        "record_step_curve",
        lambda out: curve_record(FAKE_CURVES[json.loads((out / "onnx.json").read_text())["quantization"]]),
    )
    calls = []

    def fake_rates(exports, depth):
        calls.append((sorted(exports), depth))
        assert all((path / "onnx.json").is_file() for path in exports.values())  # every candidate exported whole
        return {
            "int8": {"tokens_per_second": 50.0, "acceptance_length": 1.5},
            "int4": {"tokens_per_second": 100.0, "acceptance_length": 1.7},
        }

    monkeypatch.setattr(decode_rate, "measure_decode_rates", fake_rates)
    out = tmp_path / "engine"
    assert (
        run_export(
            "--format",
            "onnx",
            "--quantization",
            "auto",
            "--target",
            target_dir,
            "--draft",
            "prompt-lookup",
            "--out",
            out,
        ).returncode
        == 0
    )
    choice = json.loads((out / "onnx.json").read_text())["quantization_choice"]
    assert calls == [(sorted(AUTO_CANDIDATES), 7)] and choice["chosen"] == "int4"
    assert LINEAR_KERNELS["int4"] in _graph_ops(out)
    modelled = {q: round(modelled_tokens_per_second(c, 2.0, 7), 1) for q, c in FAKE_CURVES.items()}
    assert modelled["int8"] > modelled["int4"]
    for q, want in (("int8", (50.0, 1.5)), ("int4", (100.0, 1.7))):
        c = choice["candidates"][q]
        assert (c["tokens_per_second"], c["measured_acceptance_length"]) == want
        assert c["modelled_tokens_per_second"] == modelled[q]


def test_calibration_prompts_are_held_out_of_every_shipped_drafts_data_and_the_eval_sets(target_dir):
    """Four training prompts outside the seeded draw every shipped draft's data comes from (so outside the data
    itself), none an eval prompt; chat-rendered by the target."""
    import gzip
    from pathlib import Path

    from deepspec.paths import datasets_dir, eval_dataset, repo_root
    from export.onnx.decode_rate import CALIBRATION_LINES, calibration_prompts, calibration_turns
    from training.prepare import PrepareStats, read_prompts

    turns = calibration_turns()
    assert len(turns) == sum(len(lines) for lines in CALIBRATION_LINES.values()) == 4
    ids = {f"{name}:{n}" for name, lines in CALIBRATION_LINES.items() for n in lines}
    drawn = {
        row.id
        for row in read_prompts(
            [datasets_dir() / "train" / f"{name}.jsonl.gz" for name in CALIBRATION_LINES], 4000, 0, PrepareStats()
        )
    }  # training/data/README.md's command
    regen = Path(repo_root()) / "training" / "data" / "smollm2-135m-regen.jsonl.gz"
    with gzip.open(regen, "rt") as lines:
        data = {json.loads(line)["id"] for line in lines}
    assert not ids & drawn and not ids & data and data <= drawn
    eval_turns = set()
    for name in ("humaneval", "gsm8k", "mbpp", "lbpp", "math500"):
        eval_turns |= {json.loads(line)["turns"][0] for line in eval_dataset(name).read_text().splitlines()}
    assert not set(turns) & eval_turns
    target = load_target(str(target_dir))
    assert calibration_prompts(target) == [target.encode_chat([{"role": "user", "content": t}]) for t in turns]


def test_the_engine_budgets_on_the_recorded_curve_of_this_machine_only(target_dir, tmp_path, monkeypatch):
    from deepspec.decoding import SpecEngine, build_drafter

    _fake_timing(monkeypatch, tmp_path)
    out = tmp_path / "engine"
    assert (
        run_export(
            "--format", "onnx", "--quantization", "int8", "--target", target_dir, "--draft", "none", "--out", out
        ).returncode
        == 0
    )
    target = load_target(str(out))
    assert isinstance(target, OnnxTarget)
    probed = []
    import deepspec.decoding.planner as planner_module
    from deepspec.decoding.planner import BudgetPlanner

    monkeypatch.setattr(planner_module, "probe_step_curve", lambda *args: probed.append(args) or None)
    engine = SpecEngine(
        target, build_drafter("prompt-lookup", target), max_batch_size=1, max_seq_len=64, planner=BudgetPlanner()
    )
    assert not probed
    curve = engine.planner.step_time
    assert curve is not None
    assert curve.sizes.tolist() == sorted(FAKE_CURVES["int8"])
    assert curve.times.tolist() == pytest.approx([FAKE_CURVES["int8"][n] for n in sorted(FAKE_CURVES["int8"])])
    target.meta["step_curve"]["machine"] = {**machine_key(), "cpu": "another CPU"}  # timed elsewhere: probe here
    assert target.recorded_step_curve() is None
    SpecEngine(
        target, build_drafter("prompt-lookup", target), max_batch_size=1, max_seq_len=64, planner=BudgetPlanner()
    )
    assert probed


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_a_quantized_export_of_an_untied_target_gives_its_drafts_the_fp32_head(target_dir, tmp_path, quant):
    """The graph holds an untied head 8- or 4-bit; a neural draft that shares the target's head gets the exact fp32
    head from the sidecar the export writes (before it, loading the draft failed: no fp32 head initializer)."""
    import torch

    from deepspec.decoding import build_drafter
    from deepspec.models import pytorch_decoder

    draft = write_draft(tmp_path / "dspark", target_dir, "dspark")
    out = tmp_path / "engine"
    result = run_export(
        "--format", "onnx", "--quantization", quant, "--target", target_dir, "--draft", draft, "--out", out
    )
    assert result.returncode == 0, result.stderr
    assert "lm_head.weight_t" not in {
        t.name for t in onnx.load(out / "target.onnx", load_external_data=False).graph.initializer
    }
    target = load_target(str(out))
    assert isinstance(target, OnnxTarget)
    reference = pytorch_decoder(load_target(str(target_dir), dtype="float32"))
    assert target.meta["head_file"] == "lm_head.npy"
    assert torch.equal(target.embeddings().head, reference.head.detach())
    assert torch.equal(target.embeddings().embed, reference.embed.detach())
    assert build_drafter(str(out / "draft"), target) is not None
