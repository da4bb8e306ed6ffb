"""curve: the τ-vs-tokens record, its log fit and extrapolation, measuring a run's newest checkpoint end to end on
a tiny target, and a training run that stops on SIGTERM with its checkpoint saved (what `--resume` continues)."""

from __future__ import annotations

import json
import math
import os
import signal

import pytest

from tests.training.helpers import tiny_hf_target_dir, write_conversations
from training.__main__ import main
from training.config import TrainConfig
from training.curve import Record, fit_log_tokens, parse_reference, tokens_at_step
from training.trainer import Trainer, install_stop_handlers, latest_checkpoint, train


def test_fit_recovers_a_log_line_and_solves_for_the_goal():
    tokens = [1e4, 1e5, 1e6]
    fit = fit_log_tokens(tokens, [1.0 + 0.25 * math.log10(t) for t in tokens])
    assert fit.a == pytest.approx(1.0) and fit.b == pytest.approx(0.25) and fit.slope_se == pytest.approx(0, abs=1e-9)
    assert fit.tokens_for(3.0) == pytest.approx(1e8, rel=1e-6)  # 1 + 0.25 * 8 = 3


def test_fit_interval_brackets_the_estimate_and_a_flat_curve_never_arrives():
    fit = fit_log_tokens([1e4, 1e5, 1e6, 1e7], [1.1, 1.5, 1.6, 2.1])
    lo, hi = fit.tokens_interval(3.0)
    assert fit.slope_se > 0 and lo < fit.tokens_for(3.0) < hi
    flat = fit_log_tokens([1e4, 1e5, 1e6], [1.5, 1.4, 1.3])
    assert flat.tokens_for(3.0) == math.inf
    two = fit_log_tokens([1e4, 1e5], [1.0, 1.5])
    assert math.isnan(two.slope_se) and all(math.isnan(x) for x in two.tokens_interval(3.0))


def test_fit_refuses_too_few_or_degenerate_points():
    with pytest.raises(ValueError, match="at least 2"):
        fit_log_tokens([1e4], [1.0])
    with pytest.raises(ValueError, match="same token count"):
        fit_log_tokens([1e4, 1e4], [1.0, 1.2])


def test_record_replaces_a_step_and_keeps_token_order(tmp_path):
    rec = Record(tmp_path / "r" / "curve.json")
    rec.add({"step": 20, "tokens_seen": 2000, "tau": {"a": 1.5}}, {"draft": "x"})
    rec.add({"step": 10, "tokens_seen": 1000, "tau": {"a": 1.2}}, {"draft": "ignored"})
    rec.add({"step": 20, "tokens_seen": 2000, "tau": {"a": 1.6}}, {})
    data = rec.load()
    assert data["draft"] == "x" and [(p["step"], p["tau"]["a"]) for p in data["points"]] == [(10, 1.2), (20, 1.6)]
    assert rec.steps() == {10, 20}


def test_tokens_at_step_reads_the_train_log(tmp_path):
    (tmp_path / "train_log.jsonl").write_text(
        "\n".join(json.dumps({"step": s, "tokens": 100 * s}) for s in (1, 2, 3)) + "\n{partial"
    )
    assert tokens_at_step(tmp_path, 2) == 200


def test_reference_spec_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="DIR=TOKENS"):
        parse_reference(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="eval.json not found"):
        parse_reference(f"{tmp_path}=1000")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 4-step Eagle3 run on a tiny target with checkpoints at steps 2 and 4, and a toy eval set."""
    root = tmp_path_factory.mktemp("curve")
    target_dir = tiny_hf_target_dir(root / "target")
    data = write_conversations(root / "data.jsonl", rows=6)
    (root / "ds" / "eval").mkdir(parents=True)
    (root / "ds" / "eval" / "toy.jsonl").write_text(
        "\n".join(json.dumps({"turns": [q]}) for q in ["add 1 and 2", "say hi"]) + "\n"
    )
    cfg = TrainConfig.model_validate(
        {
            "target": {"name": str(target_dir)},
            "model": {"algo": "eagle3", "block_size": 4, "draft_vocab_size": 32, "feature_layers": [0, 1, 2]},
            "data": {"paths": [str(data)], "max_len": 64, "labels": "target", "label_top_k": 8},
            "optim": {"max_steps": 4, "lr": 1e-3, "warmup_steps": 1, "grad_accum": 1},
            "output_dir": str(root / "run"),
            "save_every": 2,
        }
    )
    train(cfg, show_progress=False)
    return root, target_dir, cfg


def test_curve_measures_the_newest_checkpoint_once_and_plots(run, monkeypatch, capsys):
    root, target_dir, _ = run
    monkeypatch.setenv("DEEPSPEC_DATASETS_DIR", str(root / "ds"))
    record, png = root / "curve.json", root / "curve.png"
    args = [
        "curve",
        "--run",
        str(root / "run"),
        "--record",
        str(record),
        "--target",
        str(target_dir),
        "--datasets",
        "toy",
        "--num-prompts",
        "2",
        "--max-tokens",
        "8",
    ]
    assert main(args) == 0
    data = json.loads(record.read_text())
    (point,) = data["points"]
    log = [json.loads(line) for line in (root / "run" / "train_log.jsonl").read_text().splitlines()]
    assert point["step"] == 4 and point["tokens_seen"] == log[3]["tokens"]
    assert set(point["tau"]) == {"toy"} and point["tau"]["toy"] >= 1.0
    assert data["settings"]["num_prompts"] == 2 and data["settings"]["temperature"] == 0.0
    assert main(args + ["--plot", str(png)]) == 0  # same checkpoint: not measured twice
    assert len(json.loads(record.read_text())["points"]) == 1 and png.stat().st_size > 1000


def test_curve_cli_errors(run, tmp_path, capsys):
    root, target_dir, _ = run
    assert main(["curve", "--run", str(tmp_path / "nope"), "--record", str(tmp_path / "r.json")]) == 2
    assert "run directory" in capsys.readouterr().err
    assert main(["curve", "--record", str(tmp_path / "r.json"), "--plot", str(tmp_path / "p.png")]) == 2
    assert "no points to plot" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["curve", "--record", str(tmp_path / "r.json"), "--every-minutes", "0"])


def test_sigterm_stops_after_the_step_with_a_checkpoint(run, tmp_path):
    _, _, cfg = run
    cfg = cfg.model_copy(update={"output_dir": tmp_path / "sig", "save_every": 0})
    trainer = Trainer(cfg, show_progress=False)
    step = trainer.train_step

    def step_then_signal():
        n = step()
        if trainer.step == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return n

    trainer.train_step = step_then_signal
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        install_stop_handlers(trainer)
        summary = trainer.run()
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    assert summary["stopped"] == "signal" and summary["steps"] == 1
    checkpoint = latest_checkpoint(tmp_path / "sig")
    assert checkpoint is not None and checkpoint.name == "step_0000001"
    resumed = train(cfg, resume=True, show_progress=False)
    assert resumed["steps"] == 4 and resumed["stopped"] == "max_steps"


def test_history_series_are_fitted_and_drawn(tmp_path):
    from training.curve import plot_curve, summarize_fit

    data = {
        "draft": "d",
        "points": [{"step": 1, "tokens_seen": 1000, "tau": {"a": 1.0, "b": 1.2}}],
        "history": {
            "old": {
                "points": [
                    {"tokens_seen": 1e4, "tau": {"a": 1.2, "b": 1.4}},
                    {"tokens_seen": 1e5, "tau": {"a": 1.4, "b": 1.6}},
                ]
            }
        },
    }
    fit = summarize_fit(data, {"a": 2.2, "b": 2.4})
    assert fit is not None
    old = fit["history"]["old"]
    assert old["b_per_decade"] == pytest.approx(0.2) and old["tokens_to_goal"] == pytest.approx(1e9, rel=1e-2)
    assert "a" not in fit  # one point of the run itself: no fit of its own yet
    plot_curve(data, tmp_path / "c.png", goal={"a": 2.2, "b": 2.4})
    assert (tmp_path / "c.png").stat().st_size > 1000


def test_markdown_table_lists_points_with_their_mean():
    from training.curve import markdown_table

    table = markdown_table({"points": [{"step": 5, "tokens_seen": 12345, "tau": {"a": 1.0, "b": 2.0}}]})
    assert table.splitlines()[0] == "| step | tokens seen | τ a | τ b | mean τ |"
    assert table.splitlines()[2] == "| 5 | 12,345 | 1.00 | 2.00 | 1.50 |"


def test_points_without_tau_are_left_out_of_the_fit_and_shown_as_dashes(tmp_path):
    """A checkpoint the verify budget never let draft has no τ (not 1.0): the fit skips it, the table says "-"."""
    from training.curve import markdown_table, plot_curve, summarize_fit

    points = [
        {"step": 1, "tokens_seen": 1000, "tau": {"a": None, "b": None}},
        {"step": 2, "tokens_seen": 10_000, "tau": {"a": 1.2, "b": 1.4}},
        {"step": 3, "tokens_seen": 100_000, "tau": {"a": 1.4, "b": 1.6}},
    ]
    fit = summarize_fit({"points": points}, None)
    assert fit is not None and fit["num_points"] == 2 and fit["b_per_decade"] == pytest.approx(0.2)
    assert markdown_table({"points": points}).splitlines()[2] == "| 1 | 1,000 | - | - | - |"
    plot_curve({"draft": "d", "points": points}, tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 1000


def test_greedy_tau_skips_sets_without_tau(tmp_path):
    from training.curve import greedy_tau

    (tmp_path / "eval.json").write_text(
        json.dumps(
            {
                "results": [
                    {"dataset": "humaneval", "temperature": 0.0, "acceptance_length": None},
                    {"dataset": "gsm8k", "temperature": 0.0, "acceptance_length": 2.5},
                ]
            }
        )
    )
    assert greedy_tau(tmp_path) == {"gsm8k": 2.5}
