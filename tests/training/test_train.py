"""The train stage end to end on a tiny Hugging Face target: config validation, bad data, offline cache, bit-for-bit
resume, and a 2-process gloo (DDP) run under torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.ports import free_port
from tests.training.helpers import tiny_hf_target_dir, write_conversations
from training.__main__ import main
from training.config import TrainConfig, load_config
from training.trainer import train


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    target_dir = tiny_hf_target_dir(root / "target")
    data = write_conversations(root / "data.jsonl", rows=6)
    return root, target_dir, data


def _cfg(setup, out, algo="dspark", **optim) -> TrainConfig:
    root, target_dir, data = setup
    return TrainConfig.model_validate(
        {
            "target": {"name": str(target_dir)},
            "model": {"algo": algo, "block_size": 4, "draft_vocab_size": 32, "feature_layers": [0, 1, 2]},
            "data": {"paths": [str(data)], "max_len": 64, "num_anchors": 8},
            "optim": {"max_steps": 4, "lr": 1e-3, "warmup_steps": 1, "grad_accum": 2, **optim},
            "output_dir": str(out),
            "save_every": 2,
        }
    )


def test_config_rejects_unknown_keys_and_merges_overrides(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("model:\n  algo: dflash\noptim:\n  lr: 1.0e-4\n")
    cfg = load_config([f], {"model.algo": None}, ["optim.lr=3e-4", "model.feature_layers=[1, 2]"])
    assert cfg.model.algo == "dflash" and cfg.optim.lr == 3e-4 and cfg.model.feature_layers == [1, 2]
    with pytest.raises(Exception, match="Extra inputs are not permitted"):
        load_config([], {}, ["optim.learning_rate=1"])
    with pytest.raises(Exception, match="algo"):
        load_config([], {}, ["model.algo=medusa"])


def test_cli_errors_are_clear(setup, tmp_path, capsys):
    root, target_dir, data = setup
    with pytest.raises(SystemExit):
        main(["train", "--algo", "medusa"])
    assert "invalid choice: 'medusa'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--algo", "eagle3", "optim.lr"])
    assert "section.key=value" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    code = main(
        ["train", "--algo", "eagle3", "--target", str(target_dir), "--data", str(empty), "--out", str(tmp_path / "o")]
    )
    assert code == 2 and "no usable training rows" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--algo", "eagle3", "--data", str(data), "--threads", "0", "--out", str(tmp_path / "o")])
    assert "--threads must be >= 1" in capsys.readouterr().err


def test_malformed_lines_are_skipped_with_a_count(setup, tmp_path):
    root, target_dir, data = setup
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(data.read_text() + "{not json\n" + json.dumps({"conversations": [{"role": "user"}]}) + "\n")
    cfg = _cfg(setup, tmp_path / "out", "eagle3", max_steps=1)
    cfg.data.paths = [mixed]
    lines = []
    train(cfg, show_progress=False, log=lines.append)
    assert any("skipped 2 malformed rows" in line for line in lines)


def test_max_sequences_trains_on_the_first_rows_only(setup, tmp_path):
    cfg = _cfg(setup, tmp_path / "out", "eagle3", max_steps=1)
    cfg.data.max_sequences = 2
    lines = []
    train(cfg, show_progress=False, log=lines.append)
    assert any(line.startswith("2 sequences, ") for line in lines), lines
    full = _cfg(setup, tmp_path / "all", "eagle3", max_steps=1)
    lines = []
    train(full, show_progress=False, log=lines.append)
    assert any(line.startswith("6 sequences, ") for line in lines), lines


def test_losses_fall_and_resume_is_bit_for_bit(setup, tmp_path):
    full = train(_cfg(setup, tmp_path / "full"), show_progress=False)
    assert full["steps"] == 4
    log = [json.loads(line) for line in (tmp_path / "full" / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["loss"] < log[0]["loss"]
    train(_cfg(setup, tmp_path / "split"), show_progress=False, stop_at_step=2)
    assert (tmp_path / "split" / "checkpoints" / "step_0000002").is_dir()
    resumed = train(_cfg(setup, tmp_path / "split"), resume=True, show_progress=False)
    assert resumed["steps"] == 4
    a = load_file(tmp_path / "full" / "model.safetensors")
    b = load_file(tmp_path / "split" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_init_from_fine_tunes_a_trained_draft(setup, tmp_path):
    train(_cfg(setup, tmp_path / "first", "dflash", max_steps=2), show_progress=False)
    first = load_file(tmp_path / "first" / "model.safetensors")
    # a step with a vanishing learning rate must leave the loaded weights where the first run left them
    cfg = _cfg(setup, tmp_path / "more", "dflash", max_steps=1, lr=1e-20, warmup_steps=0)
    cfg.init_from = tmp_path / "first"
    cfg.model.block_size = 3  # the checkpoint's sizes win over model.*
    lines = []
    train(cfg, show_progress=False, log=lines.append)
    assert any("starting from the weights and vocabulary of" in line for line in lines)
    more = load_file(tmp_path / "more" / "model.safetensors")
    assert more.keys() == first.keys() and all(torch.allclose(more[k], first[k]) for k in first)
    assert torch.equal(
        load_file(tmp_path / "more" / "vocab_map.safetensors")["d2t"],
        load_file(tmp_path / "first" / "vocab_map.safetensors")["d2t"],
    )
    assert json.loads((tmp_path / "more" / "config.json").read_text())["block_size"] == 4
    wrong = _cfg(setup, tmp_path / "wrong", "eagle3", max_steps=1)
    wrong.init_from = tmp_path / "first"
    with pytest.raises(ValueError, match="is a dflash draft, but model.algo is eagle3"):
        train(wrong, show_progress=False)


def test_bf16_precision_autocasts_on_cpu(setup, tmp_path):
    """precision=bf16 runs the draft's matmuls in bf16 on CPU too (it used to autocast on CUDA only): the same run
    lands near the fp32 one, not on it."""
    exact = _cfg(setup, tmp_path / "fp32", "eagle3", max_steps=2)
    exact.precision = "fp32"
    fp32 = train(exact, show_progress=False)
    cfg = _cfg(setup, tmp_path / "bf16", "eagle3", max_steps=2)
    cfg.precision = "bf16"
    bf16 = train(cfg, show_progress=False)
    assert bf16["last"]["loss"] != fp32["last"]["loss"]
    assert abs(bf16["last"]["loss"] - fp32["last"]["loss"]) < 0.05 * abs(fp32["last"]["loss"])


@pytest.mark.parametrize(
    "flags, device, bf16",
    [
        ("avx2 fma f16c avx512f avx512_vnni avx512_bf16", "cpu", True),  # Zen 4: native bf16 matmuls
        ("avx2 fma f16c amx_tile amx_int8", "cpu", True),  # a Xeon with AMX
        ("avx2 fma f16c", "cpu", False),  # bf16 emulated: slower than fp32
        ("avx2 fma f16c", "cuda:0", True),
    ],
)
def test_auto_precision_is_bf16_where_the_hardware_multiplies_bf16(monkeypatch, flags, device, bf16):
    from training.trainer import autocast_bf16

    monkeypatch.setattr("deepspec.models.step_curve.cpu_flags", lambda: flags)
    assert autocast_bf16("auto", device) is bf16
    assert autocast_bf16("fp32", device) is False and autocast_bf16("bf16", device) is True


def test_offline_cache_matches_online(setup, tmp_path):
    online = train(_cfg(setup, tmp_path / "on", "eagle3", max_steps=2), show_progress=False)
    cfg = _cfg(setup, tmp_path / "off", "eagle3", max_steps=2)
    cfg.cache_dir = tmp_path / "cache"
    lines = []
    offline = train(cfg, show_progress=False, log=lines.append)
    assert any("offline cache: writing" in line for line in lines)
    assert abs(online["last"]["loss"] - offline["last"]["loss"]) < 1e-4
    assert len(list((tmp_path / "cache").glob("*.safetensors"))) == 6


def test_the_native_decoder_writes_the_offline_cache(setup, tmp_path):
    """features_from native: the native CPU decoder on the target's served weights (int8 here, a float target)
    computes the features and final hidden states the draft trains on; they are the PyTorch target's within the
    weights' rounding, so training on them lands where training on the target's own does. Its files are tagged with
    their writer, so switching writers recomputes them; soft labels it cannot write are refused."""
    pytest.importorskip("deepspec.models.native")
    reference = train(_cfg(setup, tmp_path / "ref", "eagle3", max_steps=2), show_progress=False)
    cfg = _cfg(setup, tmp_path / "nat", "eagle3", max_steps=2)
    cfg.cache_dir, cfg.features_from = tmp_path / "cache", "native"
    native = train(cfg, show_progress=False)
    meta = json.loads((tmp_path / "cache" / "meta.json").read_text())
    assert meta["writer"].startswith("NativeTarget/")
    assert abs(native["last"]["loss"] - reference["last"]["loss"]) < 0.05 * abs(reference["last"]["loss"])
    assert native["last"]["loss"] != reference["last"]["loss"]  # computed by the other decoder, not read back
    written = {p.name: load_file(p)["features"] for p in (tmp_path / "cache").glob("*.safetensors")}
    cfg.features_from = "target"
    train(cfg, show_progress=False)  # the target's files replace the native ones
    assert json.loads((tmp_path / "cache" / "meta.json").read_text())["writer"] == "target"
    rewritten = {p.name: load_file(p)["features"] for p in (tmp_path / "cache").glob("*.safetensors")}
    assert written.keys() == rewritten.keys() and not all(torch.equal(written[k], rewritten[k]) for k in written)
    cfg.features_from, cfg.data.labels = "native", "target"
    with pytest.raises(ValueError, match="soft labels"):
        train(cfg, show_progress=False)


def test_the_native_decoder_computes_online_features(setup, tmp_path):
    """features_from native without a cache: the native decoder runs inside the loop (nothing written before the
    first step), and training lands where the PyTorch target's features take it, within the weights' rounding."""
    pytest.importorskip("deepspec.models.native")
    reference = train(_cfg(setup, tmp_path / "ref", "eagle3", max_steps=2), show_progress=False)
    cfg = _cfg(setup, tmp_path / "nat", "eagle3", max_steps=2)
    cfg.features_from = "native"
    lines = []
    native = train(cfg, show_progress=False, log=lines.append)
    assert not any("offline cache" in line for line in lines)
    assert abs(native["last"]["loss"] - reference["last"]["loss"]) < 0.05 * abs(reference["last"]["loss"])
    assert native["last"]["loss"] != reference["last"]["loss"]  # the native decoder's features, not the target's


def test_offline_cache_recomputes_only_stale_files(setup, tmp_path):
    """Editing the data must never train on features of the old text: changed sequences are recomputed, the
    unchanged ones are kept, and the cache is complete only for the data it was built from."""
    from deepspec.models import load_target
    from training.data import Sequence
    from training.features import OfflineFeatures
    from training.losses import FinalHidden

    target = load_target(str(setup[1]), dtype="float32")
    cache = OfflineFeatures(tmp_path / "cache", target, (0, 1))
    seqs = [Sequence([1, 2, 3, 4], [0, 1, 1, 1]), Sequence([5, 6, 7], [0, 1, 1])]
    cache.build(seqs)
    assert cache.is_complete(seqs)
    kept = (tmp_path / "cache" / "0.safetensors").stat().st_mtime_ns
    edited = [seqs[0], Sequence([5, 6, 8, 9, 10], [0, 1, 1, 1, 1])]
    assert not cache.is_complete(edited)
    cache.build(edited)
    assert cache.is_complete(edited)
    assert (tmp_path / "cache" / "0.safetensors").stat().st_mtime_ns == kept
    features, final = cache([1], torch.tensor([edited[1].input_ids]))
    fresh = OfflineFeatures(tmp_path / "fresh", target, (0, 1))
    fresh.build([edited[1]])
    expect, expect_final = fresh([0], torch.tensor([edited[1].input_ids]))
    assert isinstance(final, FinalHidden) and isinstance(expect_final, FinalHidden)  # final hidden states + lse
    assert torch.equal(features, expect) and torch.equal(final.hidden, expect_final.hidden)
    assert torch.equal(final.lse, expect_final.lse)


def _torchrun(setup, out: Path, *overrides: str, resume: bool = False) -> dict:
    root, target_dir, data = setup
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(free_port()),
        "-m",
        "training",
        "train",
        "--algo",
        "dflash",
        "--target",
        str(target_dir),
        "--data",
        str(data),
        "--out",
        str(out),
        "model.block_size=4",
        "model.draft_vocab_size=32",
        "model.feature_layers=[0,1,2]",
        "data.max_len=64",
        "data.num_anchors=8",
        "dist.backend=gloo",
        # a constant learning rate, so a run stopped at step 2 and resumed to 3 follows the same schedule
        "optim.warmup_steps=0",
        "optim.min_lr_ratio=1.0",
        "save_every=1",
        *overrides,
        *(["--resume"] * resume),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-8000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


@pytest.mark.integration
def test_two_process_gloo_ddp_and_fsdp_agree(setup, tmp_path):
    """2 ranks on CPU: DDP, FSDP (sharded weights and AdamW state) and an FSDP run resumed from its sharded
    checkpoint all land on the same weights — the ranks really average gradients, and resume restores the shards."""
    ddp = _torchrun(setup, tmp_path / "ddp", "optim.max_steps=3")
    assert ddp["world_size"] == 2 and ddp["steps"] == 3
    fsdp = _torchrun(setup, tmp_path / "fsdp", "optim.max_steps=2", "dist.fsdp=true")
    assert fsdp["world_size"] == 2 and fsdp["steps"] == 2
    expect2 = _weights(tmp_path / "ddp" / "checkpoints" / "step_0000002")
    got2 = _weights(tmp_path / "fsdp")
    assert expect2.keys() == got2.keys()
    for name in expect2:
        torch.testing.assert_close(got2[name], expect2[name], atol=1e-5, rtol=1e-4, msg=name)
    resumed = _torchrun(setup, tmp_path / "fsdp", "optim.max_steps=3", "dist.fsdp=true", resume=True)
    assert resumed["steps"] == 3
    expect3, got3 = _weights(tmp_path / "ddp"), _weights(tmp_path / "fsdp")
    for name in expect3:
        torch.testing.assert_close(got3[name], expect3[name], atol=1e-5, rtol=1e-4, msg=name)
    # and one step of training moved them: the comparison is not between untouched initial weights
    assert any(not torch.equal(expect2[n], expect3[n]) for n in expect3)
