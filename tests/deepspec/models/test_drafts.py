"""Draft architectures: sizing from the target, registry, checkpoint round trip, refusal of the wrong target,
and clear errors for corrupt checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from deepspec.models.drafts import (
    DraftCheckpointError,
    DraftConfig,
    DraftTargetMismatchError,
    best_shipped_draft,
    build_draft,
    load_draft,
    ranked_shipped_drafts,
    save_draft,
)
from tests.training.helpers import tiny_draft, tiny_target

ALGOS = ["eagle3", "dflash", "dspark"]


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def _logits(draft):
    torch.manual_seed(1)
    F = torch.randn(1, 10, draft.cfg.feature_size).to(draft.fc.weight.dtype)
    x = torch.randint(draft.cfg.vocab_size, (1, 10))
    if draft.cfg.algo == "eagle3":
        return torch.stack(draft.ttt_forward(F, x, 3))
    hidden = draft.train_forward(F, x, torch.tensor([[2, 5]]))
    return draft.head(hidden)


def test_each_algorithm_builds_its_own_module_and_unknown_ones_are_refused(target):
    for algo, module in (("eagle3", "Eagle3Draft"), ("dflash", "DFlashDraft"), ("dspark", "DSparkDraft")):
        assert type(build_draft(DraftConfig.for_target(target, algo))).__name__ == module
    with pytest.raises(ValueError, match=r"unknown draft algorithm 'medusa'; available: \['dflash', 'dspark', "):
        DraftConfig.for_target(target, "medusa")
    with pytest.raises(ValueError, match="unknown draft algorithm 'medusa'"):
        DraftConfig.from_dict({**DraftConfig.for_target(target, "eagle3").to_dict(), "algo": "medusa"})


def test_sized_from_target(target):
    cfg = DraftConfig.for_target(target, "eagle3")
    assert (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (32, 4, 2, 8)
    assert cfg.intermediate_size == target.spec.intermediate_size and cfg.num_layers == 1
    assert DraftConfig.for_target(target, "dflash").num_layers == 2
    assert cfg.target == target.fingerprint()


@pytest.mark.parametrize("algo", ALGOS)
def test_save_load_identical_logits(target, algo, tmp_path):
    draft = tiny_draft(target, algo, draft_vocab_size=24).eval()
    draft.set_vocab(torch.arange(0, 48, 2))
    path = save_draft(draft, tmp_path / algo)
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors", "vocab_map.safetensors"]
    loaded = load_draft(path, target)
    assert torch.equal(loaded.d2t, draft.d2t)
    with torch.no_grad():
        assert torch.equal(_logits(draft), _logits(loaded))


@pytest.mark.parametrize("algo", ALGOS)
def test_bf16_cpu_drafts_prepack_without_changing_logits(algo, tmp_path):
    """A draft loaded against a bf16 CPU target runs its linears and head on oneDNN-packed weights at inference
    (several times faster at drafting shapes); the logits are the plain bf16 F.linear ones."""
    from deepspec.models.packed_linear import onednn_pack

    if onednn_pack(torch.zeros(8, 8, dtype=torch.bfloat16)) is None:
        pytest.skip("this torch build has no oneDNN bf16 linear")
    from deepspec.models import pytorch_decoder

    target = tiny_target()
    pytorch_decoder(target).to(torch.bfloat16)
    path = save_draft(tiny_draft(target, algo, draft_vocab_size=24), tmp_path / algo)
    packed = load_draft(path, target)
    assert packed._head_packed is not None and any(type(m).__name__ == "PackedLinear" for m in packed.modules())
    assert set(packed.state_dict()) == set(load_draft(path, target).state_dict())  # same checkpoint keys
    plain = load_draft(path, target)
    plain._head_packed = None
    for m in plain.modules():
        if type(m).__name__ == "PackedLinear":
            m.__class__ = torch.nn.Linear
    with torch.no_grad():
        a, b = _logits(packed), _logits(plain)
    assert a.dtype == b.dtype and torch.allclose(a, b, atol=2e-2, rtol=2e-2)


def test_bf16_storage_halves_size(target, tmp_path):
    draft = tiny_draft(target, "dflash")
    a = save_draft(draft, tmp_path / "fp32") / "model.safetensors"
    b = save_draft(draft, tmp_path / "bf16", storage_dtype="bfloat16") / "model.safetensors"
    assert b.stat().st_size < 0.6 * a.stat().st_size
    assert load_draft(b.parent, target).fc.weight.dtype == torch.float32


def test_wrong_target_names_the_mismatch(target, tmp_path):
    path = save_draft(tiny_draft(target, "eagle3"), tmp_path / "d")
    other = tiny_target(vocab_size=80)
    with pytest.raises(DraftTargetMismatchError, match="vocab_size: draft was trained on 64, target has 80"):
        load_draft(path, other)


def test_corrupt_checkpoints_fail_clearly(target, tmp_path):
    path = save_draft(tiny_draft(target, "dspark"), tmp_path / "d")
    with pytest.raises(DraftCheckpointError, match="config.json is missing"):
        load_draft(tmp_path / "nothing", target)
    weights = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    with pytest.raises(DraftCheckpointError, match="corrupt or truncated"):
        load_draft(path, target)
    (path / "config.json").write_text("{not json")
    with pytest.raises(DraftCheckpointError, match="not valid JSON"):
        load_draft(path, target)
    cfg = json.loads(json.dumps(DraftConfig.for_target(target, "eagle3").to_dict()))
    cfg["num_layers"] = 3
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "model.safetensors").write_bytes(weights)
    with pytest.raises(DraftCheckpointError, match="do not fit"):
        load_draft(path, target)


def _name(path: Path | None) -> str:
    """The directory name of the draft chosen (one must be)."""
    assert path is not None, "no draft chosen"
    return path.name


def test_best_shipped_draft_picks_highest_greedy_tau(target, tmp_path):
    for name, tau in [("a", 2.0), ("b", 3.5), ("c", 3.0)]:
        d = save_draft(tiny_draft(target, "eagle3"), tmp_path / name)
        (d / "eval.json").write_text(
            json.dumps(
                {
                    "results": [
                        {"dataset": "x", "temperature": 0.0, "acceptance_length": tau},
                        {"dataset": "x", "temperature": 1.0, "acceptance_length": 9.0},
                    ]
                }
            )
        )
    assert _name(best_shipped_draft(target, tmp_path)) == "b"
    assert best_shipped_draft(tiny_target(vocab_size=80), tmp_path) is None
    # a draft measured slower than target-only is never the default, whatever its τ
    (tmp_path / "b" / "eval.json").write_text(
        json.dumps({"results": [{"dataset": "x", "temperature": 0.0, "acceptance_length": 3.5, "speedup": 0.8}]})
    )
    assert _name(best_shipped_draft(target, tmp_path)) == "c"
    # `auto`'s floor on τ: below it no draft qualifies
    assert best_shipped_draft(target, tmp_path, min_acceptance_length=3.1) is None


def test_a_draft_measured_faster_on_chat_is_preferred_to_a_higher_tau_on_the_shipped_sets(target, tmp_path):
    """Most served traffic is chat: `auto` ranks drafts measured on chat by their speedup there before τ elsewhere."""
    rows = {
        "code-expert": [("humaneval", 3.5, 1.6), ("chat", 1.2, 1.02)],
        "generalist": [("humaneval", 2.4, 1.3), ("chat", 1.6, 1.25), ("prompts.heldout", 1.7, 1.3)],
        "unmeasured-on-chat": [("humaneval", 3.9, 1.8)],
    }
    for name, results in rows.items():
        d = save_draft(tiny_draft(target, "eagle3"), tmp_path / name)
        (d / "eval.json").write_text(
            json.dumps(
                {
                    "results": [
                        {"dataset": s, "temperature": 0.0, "acceptance_length": tau, "speedup": speed}
                        for s, tau, speed in results
                    ]
                }
            )
        )
    assert [p.name for p in ranked_shipped_drafts(target, tmp_path)] == [
        "generalist",
        "code-expert",
        "unmeasured-on-chat",
    ]


# ---- the canonical EAGLE-3 layout (what SGLang, vLLM and TensorRT-LLM load) ------------------------------------
def _canonical_keys(H, inter, q, kv, N, V):
    """Each key → its shape: hidden H, MLP intermediate `inter`, q / kv projection widths, draft vocab N, vocab V."""
    return {
        "fc.weight": (H, 3 * H),
        "midlayer.input_layernorm.weight": (H,),
        "midlayer.hidden_norm.weight": (H,),
        "midlayer.self_attn.q_proj.weight": (q, 2 * H),
        "midlayer.self_attn.k_proj.weight": (kv, 2 * H),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * H),
        "midlayer.self_attn.o_proj.weight": (H, q),
        "midlayer.post_attention_layernorm.weight": (H,),
        "midlayer.mlp.gate_proj.weight": (inter, H),
        "midlayer.mlp.up_proj.weight": (inter, H),
        "midlayer.mlp.down_proj.weight": (H, inter),
        "norm.weight": (H,),
        "lm_head.weight": (N, H),
        "d2t": (N,),
        "t2d": (V,),
    }


def test_canonical_eagle3_state_dict_is_exactly_the_engines_names(target):
    draft = tiny_draft(target, "eagle3", layout="canonical", draft_vocab_size=24)
    d2t = torch.arange(0, 48, 2)
    draft.set_vocab(d2t)
    state = draft.state_dict()
    spec = target.spec
    want = _canonical_keys(spec.hidden_size, spec.intermediate_size, spec.q_size, spec.kv_size, 24, spec.vocab_size)
    assert {k: tuple(v.shape) for k, v in state.items()} == want
    # the engines' vocabulary encoding: target id = i + d2t[i]; t2d marks the draft's tokens
    assert state["d2t"].dtype == torch.int64 and torch.equal(state["d2t"] + torch.arange(24), d2t)
    assert state["t2d"].dtype == torch.bool and state["t2d"].sum() == 24 and bool(state["t2d"][d2t].all())


def test_canonical_eagle3_round_trips_and_starts_from_the_target_head(target, tmp_path):
    draft = tiny_draft(target, "eagle3", layout="canonical", draft_vocab_size=24).eval()
    draft.set_vocab(torch.arange(0, 48, 2))
    draft.attach(target).init_from_target()
    assert torch.equal(draft.lm_head.weight, target.embeddings().head[draft.d2t])
    torch.nn.init.normal_(draft.lm_head.weight)  # trained: no longer the target's rows
    loaded = load_draft(save_draft(draft, tmp_path / "c"), target)
    assert torch.equal(loaded.d2t, draft.d2t) and torch.equal(loaded.t2d, draft.t2d)
    with torch.no_grad():
        assert torch.equal(_logits(draft), _logits(loaded))


def test_canonical_and_deepspec_layouts_compute_the_same_function(target):
    """Same tensors under the other names (and the target head as lm_head) → the same logits: the layouts differ
    in naming and storage only."""
    ours = tiny_draft(target, "eagle3", draft_vocab_size=24).eval()
    ours.set_vocab(torch.arange(0, 48, 2))
    canon = _as_canonical(target, ours).eval()
    with torch.no_grad():
        assert torch.equal(_logits(ours), _logits(canon))


def test_norm_before_residual_changes_the_residual_only_when_set(target):
    a = tiny_draft(target, "eagle3").eval()
    b = tiny_draft(target, "eagle3", norm_before_residual=True).eval()
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        assert not torch.allclose(_logits(a), _logits(b))


def test_canonical_layout_defaults_and_refusals(target):
    from deepspec.models.drafts.config import canonical_feature_layers

    assert canonical_feature_layers(30) == (1, 14, 26)  # SmolLM2-135M; = hidden_states (2, 15, 27)
    assert canonical_feature_layers(36) == (1, 17, 32)
    with pytest.raises(ValueError, match=">= 8 layers"):
        DraftConfig.for_target(target, "eagle3", layout="canonical")  # the tiny target has 4
    with pytest.raises(ValueError, match="3 captured layers"):
        DraftConfig.for_target(target, "eagle3", layout="canonical", feature_layers=(0, 1, 2, 3))
    with pytest.raises(ValueError, match="eagle3 layout"):
        DraftConfig.for_target(target, "dflash", layout="canonical", feature_layers=(0, 1, 2))
    with pytest.raises(ValueError, match="unknown eagle3 layout"):
        DraftConfig.for_target(target, "eagle3", layout="sglang")
    cfg = DraftConfig.for_target(target, "eagle3", layout="canonical", feature_layers=(0, 1, 2))
    assert (cfg.qk_norm, cfg.qkv_bias, cfg.activation, cfg.norm_before_residual) == (False, False, "silu", False)


def _as_canonical(target, ours):
    """The canonical draft holding `ours`' tensors under the engines' names (lm_head = the target's rows)."""
    canon = tiny_draft(target, "eagle3", layout="canonical", draft_vocab_size=ours.cfg.draft_vocab_size)
    canon.set_vocab(ours.d2t)
    canon.attach(target).init_from_target()
    rename = {
        "embed_norm": "midlayer.input_layernorm",
        "hidden_norm": "midlayer.hidden_norm",
        "attn": "midlayer.self_attn",
        "mlp_norm": "midlayer.post_attention_layernorm",
        "mlp": "midlayer.mlp",
        "final_norm": "norm",
        "fc": "fc",
    }
    state = {rename[k.split(".")[0]] + k[len(k.split(".")[0]) :]: v for k, v in ours.state_dict().items()}
    canon.load_state_dict({**canon.state_dict(), **state})
    return canon


def test_canonical_eagle3_drafts_in_the_engine_exactly_like_ours(target, tmp_path):
    """Through the engine's Eagle3 drafter (per-slot KV cache, not the training forward) the canonical layout
    proposes the same tokens as our layout with the same tensors: same output, same acceptance counts."""
    from deepspec.decoding.engine import SpecEngine
    from deepspec.decoding.params import SamplingParams
    from deepspec.decoding.registry import load_checkpoint_drafter

    ours = tiny_draft(target, "eagle3", draft_vocab_size=48)
    ours.set_vocab(torch.arange(0, 48))
    prompts, params = [[1, 2, 3], [4, 5, 6, 7, 8], [9]], SamplingParams(max_tokens=20, ignore_eos=True)
    base = SpecEngine(target, None, max_batch_size=2, max_seq_len=96).generate(prompts, params)
    results = []
    for name, draft in [("ours", ours), ("canonical", _as_canonical(target, ours))]:
        drafter = load_checkpoint_drafter(save_draft(draft, tmp_path / name), target)
        # a fixed depth: the verify budget times passes, so its depths (and the counts) vary with machine load
        engine = SpecEngine(target, drafter, max_batch_size=2, max_seq_len=96, num_speculative_tokens=4)
        results.append(engine.generate(prompts, params))
    for spec in results:
        assert [r.token_ids for r in spec] == [r.token_ids for r in base]
    assert [r.num_accepted_tokens for r in results[0]] == [r.num_accepted_tokens for r in results[1]]
    assert [r.num_draft_tokens for r in results[0]] == [r.num_draft_tokens for r in results[1]]
    assert sum(r.num_draft_tokens for r in results[1]) > 0


def _int8_drafts(target):
    """One tiny draft of each algorithm and layout, as the shipped ones are stored."""
    drafts = {algo: tiny_draft(target, algo, draft_vocab_size=24) for algo in ALGOS}
    drafts["eagle3-canonical"] = tiny_draft(target, "eagle3", draft_vocab_size=24, layout="canonical")
    return drafts


@pytest.mark.parametrize("name", [*ALGOS, "eagle3-canonical"])
def test_int8_storage_is_within_half_a_step_of_each_weight(target, name, tmp_path):
    """int8 storage: every matrix comes back within half a quantization step (scale/2 of its row) of the trained
    float32 weight, every vector as its bf16 cast, integer buffers exactly; the file is under a third of float32's."""
    from deepspec.models.drafts import read_draft_weights

    draft = _int8_drafts(target)[name]
    fp32 = save_draft(draft, tmp_path / "fp32") / "model.safetensors"
    int8 = save_draft(draft, tmp_path / "int8", storage_dtype="int8") / "model.safetensors"
    assert json.loads((int8.parent / "config.json").read_text())["storage_dtype"] == "int8"
    assert int8.stat().st_size < fp32.stat().st_size / 3
    restored = read_draft_weights(int8.parent)
    assert set(restored) == set(draft.state_dict())
    for key, original in draft.state_dict().items():
        got = restored[key]
        if not original.is_floating_point():
            assert torch.equal(got, original), key
        elif original.ndim == 2:
            half_step = original.abs().amax(dim=1, keepdim=True) / 127 / 2
            assert got.dtype == torch.float32 and bool(((got - original).abs() <= half_step * 1.0001 + 1e-12).all()), (
                key
            )
        else:
            assert torch.equal(got, original.to(torch.bfloat16).float()), key


@pytest.mark.parametrize("name", [*ALGOS, "eagle3-canonical"])
def test_int8_draft_loads_to_the_compute_dtype_and_predicts_like_the_original(target, name, tmp_path):
    """Loaded from int8 the draft computes in the target's dtype, its logits stay within 5% of the float32
    original's range and its top-1 predictions (what greedy drafting proposes) agree on at least 90% of the
    positions of a small input (a random tiny draft has near-ties; a trained one is measured in drafts/README.md)."""
    draft = _int8_drafts(target)[name].eval()
    loaded = load_draft(save_draft(draft, tmp_path / name, storage_dtype="int8"), target)
    assert loaded.fc.weight.dtype == torch.float32
    with torch.no_grad():
        want, got = _logits(draft), _logits(loaded)
    assert (got - want).abs().max() < 0.05 * want.abs().max()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9


def test_int8_eagle3_drafts_in_the_engine_like_its_dequantized_self(target, tmp_path):
    """Through the engine's drafter an int8-stored canonical Eagle3 proposes exactly what the same draft holding
    the dequantized weights in float32 proposes: storage changes the weights once, at load, and nothing else."""
    from deepspec.decoding.engine import SpecEngine
    from deepspec.decoding.params import SamplingParams
    from deepspec.decoding.registry import load_checkpoint_drafter
    from deepspec.models.drafts import read_draft_weights

    draft = tiny_draft(target, "eagle3", draft_vocab_size=48, layout="canonical")
    int8_dir = save_draft(draft, tmp_path / "int8", storage_dtype="int8")
    draft.load_state_dict(read_draft_weights(int8_dir))
    fp32_dir = save_draft(draft, tmp_path / "fp32")
    prompts, params = [[1, 2, 3], [4, 5, 6, 7, 8], [9]], SamplingParams(max_tokens=20, ignore_eos=True)
    results = []
    for path in (int8_dir, fp32_dir):
        engine = SpecEngine(
            target, load_checkpoint_drafter(path, target), max_batch_size=2, max_seq_len=96, num_speculative_tokens=4
        )
        results.append(engine.generate(prompts, params))
    assert [r.token_ids for r in results[0]] == [r.token_ids for r in results[1]]
    assert [r.num_accepted_tokens for r in results[0]] == [r.num_accepted_tokens for r in results[1]]
    assert [r.num_draft_tokens for r in results[0]] == [r.num_draft_tokens for r in results[1]]
    assert sum(r.num_draft_tokens for r in results[0]) > 0


def test_int8_checkpoints_missing_a_scale_fail_clearly(target, tmp_path):
    from safetensors.torch import load_file, save_file

    path = save_draft(tiny_draft(target, "dflash"), tmp_path / "d", storage_dtype="int8")
    state = load_file(path / "model.safetensors")
    del state["fc.weight.int8_scale"]
    save_file(state, path / "model.safetensors")
    with pytest.raises(DraftCheckpointError, match="fc.weight .* needs a .* fc.weight.int8_scale"):
        load_draft(path, target)
    with pytest.raises(ValueError, match="unknown storage_dtype 'int4'"):
        save_draft(tiny_draft(target, "dflash"), tmp_path / "e", storage_dtype="int4")


def test_export_reads_int8_drafts_as_float_weights(target, tmp_path):
    """export/ converts a draft to each engine's dialect from DraftSource.weights: an int8-stored draft must come
    back as its dequantized float32 tensors, not as raw int8 codes beside stray scale tensors."""
    from deepspec.models.drafts import read_checkpoint_header, read_draft_config, read_draft_weights
    from export.sources import DraftSource

    path = save_draft(
        tiny_draft(target, "eagle3", draft_vocab_size=24, layout="canonical"), tmp_path / "d", storage_dtype="int8"
    )
    weights = DraftSource(path, read_checkpoint_header(path), read_draft_config(path)).weights()
    want = read_draft_weights(path)
    assert set(weights) == set(want) and all(torch.equal(weights[k], want[k]) for k in want)
    assert weights["lm_head.weight"].dtype == torch.float32


def test_convert_draft_storage_rewrites_the_weights_in_place_and_keeps_the_config(target, tmp_path):
    """`python -m training store`: the shipped drafts were converted this way, so every config key (calibration
    temperatures included) must survive and the result must load as a save_draft(storage_dtype='int8') would."""
    from deepspec.models.drafts import convert_draft_storage, read_draft_weights

    draft = tiny_draft(target, "dspark", draft_vocab_size=24, confidence_temperature=(1.1, 0.9, 0.8, 0.7))
    path = save_draft(draft, tmp_path / "d", storage_dtype="bfloat16")
    before = json.loads((path / "config.json").read_text())
    report = convert_draft_storage(path, "int8")
    after = json.loads((path / "config.json").read_text())
    assert after == {**before, "storage_dtype": "int8"} and report["bytes_after"] < report["bytes_before"]
    converted = read_draft_weights(path)
    for key, original in draft.state_dict().items():
        if original.is_floating_point() and original.ndim == 2:
            # half an int8 step of its row, plus the bf16 rounding the weights went through first
            bound = original.abs().amax(dim=1, keepdim=True) / 127 / 2 * 1.01 + original.abs() * 2**-8
            assert bool(((converted[key] - original).abs() <= bound + 1e-7).all()), key
        elif original.is_floating_point():
            assert torch.equal(converted[key], original.to(torch.bfloat16).float()), key
    assert load_draft(path, target).cfg.confidence_temperature == (1.1, 0.9, 0.8, 0.7)
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "config.json").write_text(json.dumps({"algo": "corpus-lookup"}))
    with pytest.raises(DraftCheckpointError, match="corpus-lookup draft: it has no weights"):
        convert_draft_storage(tmp_path / "corpus", "int8")
