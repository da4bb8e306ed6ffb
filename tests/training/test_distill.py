"""`train --labels target`: soft labels and features from one forward of the target over any text, the KL loss per
draft slot, the top-k label cache, and text rows (tiny Hugging Face target, checked against transformers itself)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.training.helpers import tiny_hf_target_dir
from training.config import TrainConfig
from training.distill import DistillFeatures, SoftLabels, kl_to_labels, l1_to_labels, soft_labels
from training.trainer import train

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """(target directory, our target, the transformers model of the same weights)."""
    from transformers import AutoModelForCausalLM

    from deepspec.models import load_target

    path = tiny_hf_target_dir(tmp_path_factory.mktemp("distill") / "target")
    return path, load_target(str(path)), AutoModelForCausalLM.from_pretrained(path).eval()


def _greedy(model, prompt: list[int], length: int) -> torch.Tensor:
    tokens = torch.tensor([prompt])
    with torch.no_grad():
        while tokens.shape[1] < length:
            nxt = model(tokens).logits[:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, nxt], dim=1)
    return tokens


def test_soft_labels_are_the_targets_softmax_at_each_position(hf):
    _, target, model = hf
    tokens = _greedy(model, [5, 17, 40], 24)
    d2t = torch.arange(0, 128, 2)  # a reduced vocabulary: every other target token
    features, labels = DistillFeatures(target, (0, 1, 2), d2t, top_k=8)([0], tokens)
    with torch.no_grad():
        ref = torch.softmax(model(tokens).logits.float(), dim=-1)  # [1, T, V]
    want = ref[..., d2t].topk(8, dim=-1)
    assert labels.probs.shape == (1, 24, 8) and labels.ids.dtype == torch.int64
    assert torch.allclose(labels.probs, want.values, atol=1e-5) and torch.equal(labels.ids, want.indices)
    # the whole vocabulary with no top-k: exactly the softmax, mass and all
    _, dense = DistillFeatures(target, (0, 1, 2), torch.arange(128), top_k=0)([0], tokens)
    assert torch.allclose(dense.probs, ref, atol=1e-5) and torch.allclose(dense.probs.sum(-1), torch.ones(1, 24))
    # shift: labels[t] is the distribution of x[t+1] — on the target's own greedy text its argmax is that token
    best = dense.ids.gather(-1, dense.probs.argmax(-1, keepdim=True))[0, :, 0]
    assert torch.equal(best[2:-1], tokens[0, 3:])


def test_features_are_the_ones_the_regen_cache_stores(hf, tmp_path):
    """One forward gives both: the features equal what OnlineFeatures / the offline cache hold, which are
    Hugging Face hidden_states[i + 1] of the captured layers."""
    from training.data import Sequence
    from training.features import OfflineFeatures, OnlineFeatures

    _, target, model = hf
    tokens = _greedy(model, [9, 3], 16)
    features, _ = DistillFeatures(target, (0, 2), torch.arange(128), top_k=4)([0], tokens)
    online, _ = OnlineFeatures(target, (0, 2))([0], tokens)
    cache = OfflineFeatures(tmp_path / "cache", target, (0, 2))
    cache.build([Sequence(tokens[0].tolist(), [1] * 16)])
    assert torch.equal(features, online) and torch.equal(
        features[0], load_file(tmp_path / "cache" / "0.safetensors")["features"]
    )
    with torch.no_grad():
        hs = model(tokens, output_hidden_states=True).hidden_states
    assert torch.allclose(features, torch.cat([hs[1], hs[3]], dim=-1), atol=1e-5)


def test_offline_cache_holds_top_k_labels_and_reads_back_the_online_ones(hf, tmp_path):
    from training.data import Sequence
    from training.features import OfflineFeatures

    _, target, model = hf
    seqs = [Sequence(_greedy(model, [i + 4], 12 + i)[0].tolist(), [1] * (12 + i)) for i in range(2)]
    distill = DistillFeatures(target, (0, 1, 2), torch.arange(0, 64), top_k=6)
    cache = OfflineFeatures(tmp_path / "c", target, (0, 1, 2), distill=distill)
    cache.build(seqs)
    stored = load_file(tmp_path / "c" / "0.safetensors")
    assert set(stored) == {"features", "label_probs", "label_ids"}  # no final hidden state, no dense distribution
    assert stored["label_probs"].shape == (12, 6) and stored["label_ids"].dtype == torch.int32
    tokens = torch.zeros(2, 13, dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, : len(s.input_ids)] = torch.tensor(s.input_ids)
    features, labels = cache([0, 1], tokens)
    assert isinstance(labels, SoftLabels)  # a distilling cache stores soft labels, not final hidden states
    f1, l1 = distill([1], tokens[1:])
    assert torch.equal(features[1], f1[0]) and torch.equal(labels.probs[1], l1.probs[0])
    assert torch.equal(labels.ids[1], l1.ids[0]) and labels.ids.dtype == torch.int64
    # a cache of the other kind (final hidden states) is not mistaken for labels
    plain = OfflineFeatures(tmp_path / "c", target, (0, 1, 2))
    assert not plain.is_complete(seqs)


def test_kl_is_zero_exactly_at_the_target_and_positive_elsewhere():
    p = torch.tensor([[0.5, 0.2, 0.1]])  # 0.2 of the mass outside the kept tokens
    labels = SoftLabels(p, torch.tensor([[3, 0, 1]]))
    match = torch.zeros(1, 4)
    match[0, [3, 0, 1]] = p[0] / p.sum()
    assert kl_to_labels(labels, torch.log(match)).abs().item() < 1e-6
    assert kl_to_labels(labels, torch.log(torch.full((1, 4), 0.25))).item() > 0.05
    # L1 with the target known on its top-k: kept differences + draft mass elsewhere + target mass elsewhere
    q = torch.tensor([[0.1, 0.1, 0.3, 0.5]])
    assert torch.allclose(l1_to_labels(labels, q), torch.tensor([(0.0 + 0.1 + 0.0) + 0.3 + 0.2]))
    full = soft_labels(torch.log(torch.tensor([[0.7, 0.2, 0.1]])), torch.arange(3), top_k=0)
    assert l1_to_labels(full, torch.tensor([[0.7, 0.2, 0.1]])).item() < 1e-6


def _text_rows(path, rows: int = 6):
    with open(path, "w") as f:
        for i in range(rows):
            f.write(json.dumps({"turns": [f"what is {i} plus {i + 1}? think step by step"], "source": "t"}) + "\n")
            f.write(json.dumps({"text": f"def f{i}(x):\n    return x + {i}\n"}) + "\n")
    return path


@pytest.mark.parametrize("algo", ["eagle3", "dflash", "dspark"])
def test_kl_loss_falls_on_text_rows(hf, tmp_path, algo):
    target_dir, _, _ = hf
    data = _text_rows(tmp_path / "text.jsonl")
    cfg = TrainConfig.model_validate(
        {
            "target": {"name": str(target_dir)},
            "model": {"algo": algo, "block_size": 3, "draft_vocab_size": 48, "feature_layers": [0, 1, 2]},
            "data": {"paths": [str(data)], "max_len": 48, "labels": "target", "label_top_k": 8, "num_anchors": 8},
            "optim": {"max_steps": 12, "lr": 3e-3, "warmup_steps": 1},
            "output_dir": str(tmp_path / "out"),
            "save_every": 0,
        }
    )
    lines = []
    summary = train(cfg, show_progress=False, log=lines.append)
    assert summary["labels"] == "target" and any("12 sequences" in line for line in lines)
    if algo == "dspark":  # the held-out row calibrates the confidence head on the same soft labels
        assert summary["num_calibration_sequences"] == 1 and len(summary["calibration"]) == 3
    losses = [json.loads(line)["loss"] for line in (tmp_path / "out" / "train_log.jsonl").read_text().splitlines()]
    assert len(losses) == 12 and all(v >= 0 for v in losses)
    # dspark's sum also holds the confidence head's BCE, which moves slower than the KL and L1
    assert sum(losses[-3:]) / 3 < (0.9 if algo == "dspark" else 0.8) * sum(losses[:3]) / 3


def test_text_rows_need_labels_target_and_the_cli_flag_sets_them(hf, tmp_path, capsys):
    from training.__main__ import main

    target_dir, _, _ = hf
    data = _text_rows(tmp_path / "text.jsonl", rows=1)
    code = main(
        ["train", "--algo", "eagle3", "--target", str(target_dir), "--data", str(data), "--out", str(tmp_path / "o")]
    )
    assert code == 2 and "train it with --labels target" in capsys.readouterr().err
    code = main(
        [
            "train",
            "--algo",
            "eagle3",
            "--labels",
            "target",
            "--target",
            str(target_dir),
            "--data",
            str(data),
            "--out",
            str(tmp_path / "o"),
            "--plan",
        ]
    )
    assert code == 0 and '"labels": "target"' in capsys.readouterr().err


def test_offline_label_cache_trains_like_online(hf, tmp_path):
    target_dir, _, _ = hf
    data = _text_rows(tmp_path / "text.jsonl", rows=2)

    def cfg(out, cache=None):
        return TrainConfig.model_validate(
            {
                "target": {"name": str(target_dir)},
                "model": {"algo": "eagle3", "block_size": 3, "draft_vocab_size": 48, "feature_layers": [0, 1, 2]},
                "data": {"paths": [str(data)], "max_len": 48, "labels": "target", "label_top_k": 8},
                "optim": {"max_steps": 3, "lr": 1e-3, "warmup_steps": 1},
                "output_dir": str(out),
                "save_every": 0,
                "cache_dir": cache,
            }
        )

    online = train(cfg(tmp_path / "on"), show_progress=False)
    lines = []
    offline = train(cfg(tmp_path / "off", str(tmp_path / "cache")), show_progress=False, log=lines.append)
    assert any("top-8 labels" in line for line in lines)
    assert abs(online["last"]["loss"] - offline["last"]["loss"]) < 1e-4
