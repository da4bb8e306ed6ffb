"""The shipped recipes under training/configs validate, and the canonical EAGLE-3 recipe trains a draft whose
checkpoint holds exactly the tensors the GPU engines load."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.training.helpers import tiny_hf_target_dir, write_conversations
from training.config import TrainConfig, load_config
from training.trainer import train

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "training" / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_recipe_validates_and_is_named_model_algo_modes(path):
    cfg = load_config([path])
    prefix = f"{cfg.target.name}-{cfg.model.algo}-"
    assert path.stem.startswith(prefix)
    modes = path.stem[len(prefix) :].split("-")  # e.g. offline | canonical | canonical-distill-long
    assert ("canonical" in modes) == (cfg.model.layout == "canonical")
    assert ("distill" in modes) == (cfg.data.labels == "target")


def test_canonical_recipe_is_the_engines_layout():
    cfg = load_config([Path(CONFIGS[0]).parent / "smollm2-135m-eagle3-canonical.yaml"])
    assert cfg.model.layout == "canonical" and cfg.model.feature_layers is None  # the engines' {1, L//2-1, L-4}
    with pytest.raises(Exception, match="eagle3 layout"):
        load_config([], {}, ["model.algo=dflash", "model.layout=canonical"])


@pytest.mark.slow
def test_canonical_eagle3_trains_and_saves_the_engines_tensor_names(tmp_path):
    from deepspec.models import load_target
    from deepspec.models.drafts import load_draft

    target_dir = tiny_hf_target_dir(tmp_path / "target")
    data = write_conversations(tmp_path / "data.jsonl", rows=4)
    cfg = TrainConfig.model_validate(
        {
            "target": {"name": str(target_dir)},
            "model": {
                "algo": "eagle3",
                "layout": "canonical",
                "block_size": 3,
                "draft_vocab_size": 32,
                "feature_layers": [0, 1, 2],
            },
            "data": {"paths": [str(data)], "max_len": 48},
            "optim": {"max_steps": 3, "lr": 1e-3, "warmup_steps": 1},
            "output_dir": str(tmp_path / "out"),
            "save_every": 0,
        }
    )
    summary = train(cfg, show_progress=False)
    assert summary["steps"] == 3 and summary["last"]["loss"] > 0
    state = load_file(tmp_path / "out" / "model.safetensors")
    layer = {
        f"midlayer.{k}.weight"
        for k in (
            "input_layernorm",
            "hidden_norm",
            "post_attention_layernorm",
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        )
    }
    assert set(state) == layer | {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"}
    assert tuple(state["fc.weight"].shape) == (32, 96) and tuple(state["lm_head.weight"].shape) == (32, 32)
    target = load_target(str(target_dir))
    draft = load_draft(tmp_path / "out", target)
    assert draft.cfg.layout == "canonical" and draft.lm_head.weight.shape == (32, 32)
    assert (draft.d2t - state["d2t"]).tolist() == list(range(32))  # offsets on disk, target ids in memory
