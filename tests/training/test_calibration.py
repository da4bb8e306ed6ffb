"""DSpark confidence calibration: the per-slot temperature fit recovers a known miscalibration, and training a
DSpark draft holds rows out, fits on them and ships the temperatures in the checkpoint."""

from __future__ import annotations

import json

import torch

from tests.training.helpers import tiny_hf_target_dir, write_conversations
from training.calibration import fit_slot_temperatures
from training.config import TrainConfig
from training.trainer import train


def test_fit_recovers_the_temperature_of_an_overconfident_head():
    g = torch.Generator().manual_seed(0)
    n = 4000
    conf = torch.randn(n, generator=g) * 3
    slot = torch.arange(n) % 3
    true_t = torch.tensor([1.0, 2.0, 4.0])[slot]  # slot j's head is over-confident by a factor true_t
    accept = torch.bernoulli(torch.sigmoid(conf / true_t), generator=g)
    temps, report = fit_slot_temperatures(conf, accept, slot, block_size=4)
    assert abs(temps[0] - 1.0) < 0.25 and abs(temps[1] - 2.0) < 0.4 and abs(temps[2] - 4.0) < 0.8
    assert temps[3] == 1.0 and report[3]["samples"] == 0  # no data for slot 3: left alone
    assert all(r["bce_calibrated"] <= r["bce_uncalibrated"] for r in report[:3])


def test_dspark_training_calibrates_on_held_out_rows(tmp_path):
    target_dir = tiny_hf_target_dir(tmp_path / "target")
    data = write_conversations(tmp_path / "data.jsonl", rows=30)
    cfg = TrainConfig.model_validate(
        {
            "target": {"name": str(target_dir)},
            "model": {
                "algo": "dspark",
                "block_size": 4,
                "draft_vocab_size": 32,
                "feature_layers": [0, 1, 2],
                "calibration_sequences": 3,
            },
            "data": {"paths": [str(data)], "max_len": 64, "num_anchors": 8},
            "optim": {"max_steps": 3, "lr": 1e-3, "warmup_steps": 1},
            "output_dir": str(tmp_path / "out"),
            "save_every": 0,
        }
    )
    summary = train(cfg, show_progress=False)
    assert summary["num_calibration_sequences"] == 3
    slots = summary["calibration"]
    assert [r["slot"] for r in slots] == [0, 1, 2, 3] and slots[0]["samples"] > 0
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["confidence_temperature"] == [r["temperature"] for r in slots]
