"""The seam of issue 23: a draft algorithm is one registration. The toy algorithm of toy.py (its module, config,
loss and drafter, all in the tests folder) is registered here and nowhere else, then trained through the training
stage's API, evaluated (acceptance, greedy identity with target-only), served by the engine (greedy output token for
token the target's own) and exported in the `pytorch` format. Without the registration each stage refuses it by
name: the registration is what the pipeline runs on, not something else in the repository."""

from __future__ import annotations

import json

import pytest

from deepspec.algorithms import register_algorithm, registry
from tests.deepspec.algorithms.toy import TOY, ToyConfig, ToyDraft, ToyDrafter
from tests.training.helpers import tiny_hf_target_dir, write_conversations

PROMPTS = [[5, 40, 41, 42, 43], [5, 50, 51]]


@pytest.fixture
def toy_registered(monkeypatch):
    monkeypatch.setattr(registry, "_ALGORITHMS", dict(registry._ALGORITHMS))  # undone after the test
    register_algorithm(TOY)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy")
    target_dir = tiny_hf_target_dir(root / "target")
    (root / "datasets" / "eval").mkdir(parents=True)
    (root / "datasets" / "eval" / "toy.jsonl").write_text(
        "\n".join(json.dumps({"turns": [q]}) for q in ["add 1 and 2", "say hi"]) + "\n"
    )
    return root, target_dir, write_conversations(root / "data.jsonl", rows=6)


def _train_config(root, target_dir, data, out):
    from training.config import TrainConfig

    return TrainConfig.model_validate(
        {
            "target": {"name": str(target_dir)},
            "model": {"algo": "toy", "block_size": 4, "draft_vocab_size": 32, "feature_layers": [0, 1, 2]},
            "data": {"paths": [str(data)], "max_len": 64},
            "optim": {"max_steps": 3, "lr": 1e-2, "warmup_steps": 1},
            "output_dir": str(out),
            "save_every": 0,
        }
    )


def _generate(target, drafter):
    from deepspec.decoding import SamplingParams, SpecEngine

    engine = SpecEngine(target, drafter, max_batch_size=2, max_seq_len=128, num_speculative_tokens=3)
    return engine.generate(PROMPTS, SamplingParams(max_tokens=12, ignore_eos=True))


def test_a_registered_toy_algorithm_trains_evaluates_serves_and_exports(toy_registered, world, monkeypatch):
    from deepspec.decoding.registry import build_drafter
    from deepspec.models import load_target
    from export.cli import main as export_main
    from training.__main__ import main as training_main
    from training.trainer import train

    root, target_dir, data = world
    draft = root / "draft"
    summary = train(_train_config(root, target_dir, data, draft), show_progress=False)
    assert (summary["algo"], summary["steps"], summary["stopped"]) == ("toy", 3, "max_steps")
    log = [json.loads(line) for line in (draft / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["loss"] < log[0]["loss"]  # the toy's own loss is what trained it
    config = json.loads((draft / "config.json").read_text())
    assert config["algo"] == "toy" and config["embedding_weight"] == 1.0  # written by the toy's own config class

    monkeypatch.setenv("DEEPSPEC_DATASETS_DIR", str(root / "datasets"))
    assert (
        training_main(
            [
                "eval",
                "--target",
                str(target_dir),
                "--draft",
                str(draft),
                "--datasets",
                "toy",
                "--num-prompts",
                "2",
                "--max-tokens",
                "8",
                "--temperatures",
                "0",
            ]
        )
        == 0
    )
    report = json.loads((draft / "eval.json").read_text())
    [greedy] = report["results"]
    assert greedy["identical_to_target"] is True and greedy["acceptance_length"] >= 1.0

    target = load_target(str(target_dir))
    drafter = build_drafter(str(draft), target)
    assert isinstance(drafter, ToyDrafter) and isinstance(drafter.model, ToyDraft)
    assert isinstance(drafter.model.cfg, ToyConfig)
    served, alone = _generate(target, drafter), _generate(target, None)
    assert [r.token_ids for r in served] == [r.token_ids for r in alone]
    assert sum(r.num_draft_tokens for r in served) > 0  # the toy drafter was asked, and verified

    out = root / "export"
    assert (
        export_main(["--target", str(target_dir), "--draft", str(draft), "--format", "pytorch", "--out", str(out)]) == 0
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["algorithm"], manifest["draft"]) == ("toy", "draft")
    assert isinstance(build_drafter(str(out / "draft"), target), ToyDrafter)


def test_without_its_registration_every_stage_refuses_the_toy_by_name(world, monkeypatch, capsys):
    """Negative control: the same toy draft directory, written while the toy was registered, once it is not."""
    from pydantic import ValidationError

    from deepspec.decoding.registry import build_drafter
    from deepspec.models import load_target
    from deepspec.models.drafts import DraftCheckpointError, DraftConfig, build_draft, save_draft
    from export.cli import main as export_main

    root, target_dir, data = world
    target = load_target(str(target_dir))
    with monkeypatch.context() as m:
        m.setattr(registry, "_ALGORITHMS", dict(registry._ALGORITHMS))
        register_algorithm(TOY)
        path = save_draft(
            build_draft(DraftConfig.for_target(target, "toy", feature_layers=(0, 1, 2))), root / "unregistered"
        )
    with pytest.raises(ValidationError, match="unknown draft algorithm 'toy'"):
        _train_config(root, target_dir, data, root / "never")
    with pytest.raises(DraftCheckpointError, match="unknown draft algorithm 'toy'"):
        build_drafter(str(path), target)
    assert (
        export_main(
            [
                "--target",
                str(target_dir),
                "--draft",
                str(path),
                "--format",
                "pytorch",
                "--out",
                str(root / "never-exported"),
            ]
        )
        == 2
    )
    assert "algo 'toy' is not one this DeepSpec exports" in capsys.readouterr().err
