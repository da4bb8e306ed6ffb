"""The ONNX export (export/onnx/) and its ONNX Runtime target (deepspec/models/onnx_target.py).

Unit tests build a tiny random Llama (head_dim 16: ONNX Runtime's attention kernel wants multiples of 16) and
check the graph against our PyTorch decoder on every kind of step the engine takes: prefill chunks, batched
decode, uneven multi-token verification, chosen logit positions. Slow tests export the real default target.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from transformers import PreTrainedTokenizerBase  # noqa: E402  (after importorskip)

from deepspec.decoding import SamplingParams, SpecEngine, build_drafter  # noqa: E402  (after importorskip)
from deepspec.models.onnx_target import OnnxTarget, load_onnx_target, session_options  # noqa: E402  (after importorskip)
from export.onnx.exporter import export_onnx  # noqa: E402  (after importorskip)
from export.onnx.graph import UnsupportedTarget, build_target_graph, check_supported  # noqa: E402  (after importorskip)
from tests.conftest import CharTokenizer  # noqa: E402  (after importorskip)

VOCAB = 64


def _char_tokenizer() -> PreTrainedTokenizerBase:
    """One character per token (tests/conftest.py): all of a tokenizer these targets read."""
    return cast(PreTrainedTokenizerBase, CharTokenizer(VOCAB))


def _asked(output: torch.Tensor | None) -> torch.Tensor:
    """A forward output the call asked for (logits or features), so present."""
    assert output is not None
    return output


def _tiny_decoder(family: str = "llama", seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from deepspec.models.arch import arch_spec_from_config
    from deepspec.models.decoder import Decoder

    torch.manual_seed(seed)
    sizes: dict[str, Any] = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    if family == "qwen3":
        config = Qwen3Config(**sizes, head_dim=16, tie_word_embeddings=False)
        hf = Qwen3ForCausalLM(config).eval()
    else:
        config = LlamaConfig(**sizes, tie_word_embeddings=True)
        hf = LlamaForCausalLM(config).eval()
    spec = arch_spec_from_config(config)
    model = Decoder(spec, max_positions=128)
    model.load_hf_state_dict(hf.state_dict(), torch.float32)
    return config, model.eval()


def _onnx_target(tmp_path: Path, family: str = "llama", quantization: str = "none", layers=(0, 2)):
    config, model = _tiny_decoder(family)
    build_target_graph(model, layers, tmp_path, quantization)
    meta = {
        "graph": "target.onnx",
        "feature_layers": list(layers),
        "max_positions": 128,
        "quantization": quantization,
        "eos_token_ids": [VOCAB - 1],
        "tied": model.head is model.embed,
    }
    session = ort.InferenceSession(str(tmp_path / "target.onnx"), session_options(1))
    target = OnnxTarget("tiny", tmp_path, model.spec, _char_tokenizer(), session, meta, 128, (VOCAB - 1,))
    return target, model


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_graph_matches_decoder_on_every_kind_of_step(tmp_path, family):
    from deepspec.models import Target
    from deepspec.models.kv_cache import KVCache

    target, model = _onnx_target(tmp_path, family)
    assert isinstance(target, Target)
    ref, ours = KVCache(model.spec, 3, 64, torch.float32), target.new_cache(3, 64)
    tokens = torch.randint(0, VOCAB, (3, 12))

    def check(x, start, logits, layers=(0, 2)):
        want = model(x, start, ref.rows(0, 3), feature_layers=layers, logits=logits)
        got = target.forward(x, start, ours.rows(0, 3), feature_layers=layers, logits=logits)
        torch.testing.assert_close(got.logits, want.logits, atol=1e-5, rtol=1e-5)
        if layers:
            torch.testing.assert_close(got.features, want.features, atol=1e-5, rtol=1e-5)

    check(tokens[:, :5], torch.zeros(3, dtype=torch.long), torch.tensor([4, 2, 3]))  # batched first prefill chunk
    check(tokens[:, 5:8], torch.full((3,), 5), "none")  # a later chunk: rows run one by one
    check(tokens[:, 8:9], torch.full((3,), 8), "all", layers=(2,))  # batched decode step, one captured layer
    check(tokens[:, 9:12], torch.tensor([9, 7, 8]), "all")  # verification at uneven lengths
    check(tokens[:, :1], torch.tensor([12, 10, 11]), "last", layers=())
    torch.testing.assert_close(ours.k[:, :, :, :12], ref.k[:, :, :, :12], atol=1e-5, rtol=1e-5)


def test_kept_bindings_follow_their_cache_and_rows(tmp_path):
    """The target keeps one IOBinding per cache and row range: two caches and two row ranges used in turn each get
    their own context (a binding bound to the wrong buffers would attend to the other cache's keys)."""
    from deepspec.models.onnx_target import MAX_BINDINGS

    target, model = _onnx_target(tmp_path)
    tokens = torch.randint(0, VOCAB, (2, 6))
    caches = [target.new_cache(2, 32), target.new_cache(2, 32)]
    for i, cache in enumerate(caches):  # a different 4-token context per cache and per row
        for row in range(2):
            target.forward(tokens[row : row + 1, i : i + 4], torch.zeros(1, dtype=torch.long), cache.rows(row, 1))
    for i, cache in enumerate(caches):
        for row in range(2):
            got = target.forward(tokens[row : row + 1, 4:5], torch.full((1,), 4), cache.rows(row, 1), logits="last")
            context = torch.cat([tokens[row : row + 1, i : i + 4], tokens[row : row + 1, 4:5]], dim=1)
            want = model(context, torch.zeros(1, dtype=torch.long), None, logits="last").logits
            torch.testing.assert_close(got.logits, want, atol=1e-5, rtol=1e-5)
    for n in range(MAX_BINDINGS + 3):  # scratch caches come and go: the kept bindings stay bounded
        target.forward(tokens[:, : 1 + n % 5], torch.zeros(2, dtype=torch.long), None)
    assert len(target._bindings) <= MAX_BINDINGS


def test_engine_on_onnx_target_decodes_what_the_pytorch_engine_decodes(tmp_path):
    from deepspec.models.decoder_target import DecoderTarget

    target, model = _onnx_target(tmp_path)
    frozen = target.embeddings()  # read back from the graph's weights file, for neural drafts
    assert torch.equal(frozen.embed, model.embed) and frozen.head is frozen.embed
    reference = DecoderTarget("tiny", tmp_path, None, model.spec, model, _char_tokenizer(), 128, (VOCAB - 1,))
    prompts = [torch.randint(0, VOCAB, (n,)).tolist() for n in (5, 9, 3, 7)]
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    for drafter in ("none", "random"):
        want = SpecEngine(reference, build_drafter(drafter, reference), max_batch_size=3, max_seq_len=64).generate(
            prompts, params
        )
        got = SpecEngine(target, build_drafter(drafter, target), max_batch_size=3, max_seq_len=64).generate(
            prompts, params
        )
        assert [r.token_ids for r in got] == [r.token_ids for r in want]


@pytest.mark.parametrize("quantization", ["int4", "int8"])
def test_quantized_graphs_use_their_kernel_and_stay_close(tmp_path, quantization):
    from export.onnx.graph import LINEAR_KERNELS

    target, model = _onnx_target(tmp_path, quantization=quantization, layers=())
    graph = onnx.load(tmp_path / "target.onnx", load_external_data=False)
    ops = [n.op_type for n in graph.graph.node]
    assert ops.count(LINEAR_KERNELS[quantization]) == 4 * 3 + 1  # qkv, o, gate_up, down per layer + the head
    assert "MatMul" not in ops
    tokens = torch.randint(0, VOCAB, (1, 16))
    want = model(tokens, torch.zeros(1, dtype=torch.long), None, logits="all").logits
    got = target.forward(tokens, torch.zeros(1, dtype=torch.long), None, logits="all").logits
    assert got is not None and want is not None
    cos = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
    assert cos > 0.98


def _one_linear(weight: np.ndarray, quantization: str, bias: np.ndarray | None = None):
    """A session over one `_Builder.linear` of the graph writer (x [R, K] → y [R, N])."""
    import tempfile

    from onnx import TensorProto, helper

    from export.onnx.graph import MS_DOMAIN, OPSET, _Builder, _Weights

    N, K = weight.shape
    with tempfile.TemporaryDirectory() as tmp:
        weights = _Weights(Path(tmp) / "w.data")
        g = _Builder(weights)
        g.linear("x", weight, "l", quantization, bias)
        g.nodes[-1].output[0] = "y"
        weights.close()
        graph = helper.make_graph(
            g.nodes,
            "one",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["R", K])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["R", N])],
            weights.initializers,
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)]
        )
        model.ir_version = 10
        onnx.save_model(model, Path(tmp) / "one.onnx")
        return ort.InferenceSession(str(Path(tmp) / "one.onnx"), session_options(2))


@pytest.mark.parametrize("quantization", ["none", "int8", "int4"])
def test_a_linears_output_row_depends_on_its_input_row_only(quantization):
    """The graph's linears are row-invariant: 8 rows in one call give, bit for bit, what each row gives beside a copy
    of itself (a batch-invariant one-token step is such a pair: deepspec/models/onnx_target.py) and, fp32 and int8,
    alone. The int8 graph used to quantize activations with one scale per call (DynamicQuantizeMatMul), so a verify
    pass's tokens were rounded by their neighbours' range; its per-row scales fix that, and this test failed before.
    MatMulNBits (int4) takes a one-row kernel on an AVX2 CPU without AVX-512 that rounds differently, so a single row
    alone is checked for the other formats only."""
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((96, 64)).astype(np.float32) * 0.1
    bias = rng.standard_normal(96).astype(np.float32)
    session = _one_linear(weight, quantization, bias)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    x[3] *= 20  # one row of a much wider range than the others
    x[5] = 0.0  # and an all-zero row
    together = session.run(None, {"x": x})[0]
    paired = np.concatenate([session.run(None, {"x": x[i : i + 1].repeat(2, 0)})[0][:1] for i in range(8)])
    assert np.array_equal(together, paired)
    if quantization != "int4":
        alone = np.concatenate([session.run(None, {"x": x[i : i + 1]})[0] for i in range(8)])
        assert np.array_equal(together, alone)
    error = np.linalg.norm(together - (x @ weight.T + bias)) / np.linalg.norm(x @ weight.T)
    assert error <= {"none": 1e-6, "int8": 0.02, "int4": 0.15}[quantization]
    np.testing.assert_allclose(together[5], bias, atol=1e-6)  # a zero row: no NaN from a zero scale


def test_int8_matmul_does_not_saturate_on_large_activations():
    """The int8 linear fed what saturated DynamicQuantizeMatMul on an AVX2 CPU without VNNI (uint8 activations near
    255 times weights at full int8 range overflow VPMADDUBSW's 16-bit pair sums): the real target then decoded
    gibberish. Weights on 7 bits keep every pair sum in range, so the product stays the float one."""
    from deepspec.models.int8_weights import quantize_int8

    rng = np.random.default_rng(0)
    weight = rng.uniform(0.5, 1.0, (8, 64)).astype(np.float32)  # one sign per row: products add up, never cancel
    weight[:, 0] = 1.0
    x = rng.uniform(0.9, 1.0, (4, 64)).astype(np.float32)  # per row scale: most values quantize to 241-255
    assert np.abs(quantize_int8(weight)[0]).max() <= 63
    got = _one_linear(weight, "int8").run(None, {"x": x})[0]
    np.testing.assert_allclose(got, x @ weight.T, rtol=0.02)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("quantization", ["none", "int8", "int4"])
def test_batch_invariant_target_computes_a_verify_pass_as_one_token_steps(tmp_path, family, quantization):
    """With batch_invariant, a verify pass of 8 tokens and 8 one-token steps give bit-equal logits and features, for
    every weight format (without it, ONNX Runtime's one-row attention kernel rounds differently: they differ)."""
    target = dataclasses.replace(_onnx_target(tmp_path, family, quantization)[0], batch_invariant=True)
    tokens = torch.randint(0, VOCAB, (1, 20))
    verify, steps = target.new_cache(1, 64), target.new_cache(1, 64)
    for cache in (verify, steps):
        target.forward(tokens[:, :12], torch.zeros(1, dtype=torch.long), cache.rows(0, 1), logits="none")
    want = target.forward(tokens[:, 12:], torch.full((1,), 12), verify.rows(0, 1), feature_layers=(0, 2), logits="all")
    got = [
        target.forward(
            tokens[:, 12 + i : 13 + i], torch.full((1,), 12 + i), steps.rows(0, 1), feature_layers=(0, 2), logits="last"
        )
        for i in range(8)
    ]
    assert torch.equal(torch.cat([_asked(g.logits) for g in got], dim=1), _asked(want.logits))
    assert torch.equal(torch.cat([_asked(g.features) for g in got], dim=1), _asked(want.features))


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_batch_invariant_speculation_is_bit_identical_to_target_only(tmp_path, quantization):
    """The engine on a batch-invariant quantized target: speculative greedy output = target-only output, in a
    batch of 3 (decode steps run row by row, as two tokens each) and up to the graph's last position (the window
    is one shorter: the copy's position is the last)."""
    target = dataclasses.replace(_onnx_target(tmp_path, quantization=quantization)[0], batch_invariant=True)
    assert target.max_seq_len == 127  # the graph's RoPE table has 128 positions
    prompts = [torch.randint(0, VOCAB, (n,)).tolist() for n in (5, 9, 1)]
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    want = SpecEngine(target, None, max_batch_size=3, max_seq_len=64).generate(prompts, params)
    for drafter in ("random", "prompt-lookup"):
        got = SpecEngine(target, build_drafter(drafter, target), max_batch_size=3, max_seq_len=64).generate(
            prompts, params
        )
        assert [r.token_ids for r in got] == [r.token_ids for r in want], drafter
    long = SpecEngine(target, build_drafter("prompt-lookup", target), max_batch_size=1, max_seq_len=127)
    out = long.generate([prompts[0]], SamplingParams(max_tokens=127 - 5, ignore_eos=True))[0]
    assert len(out.token_ids) == 122  # up to the window's last position, whose copy sits at the table's last


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_fused_graph_computes_the_plain_graph_with_fewer_nodes(tmp_path, family):
    """SkipSimplifiedLayerNormalization and packed-QKV attention are a rewrite, not an approximation; the captured
    features (read off the fused nodes' sum outputs) stay the residual stream's."""
    _, model = _tiny_decoder(family)
    counts, outs = {}, {}
    tokens = torch.randint(0, VOCAB, (2, 7))
    for fused in (False, True):
        out = tmp_path / str(fused)
        out.mkdir()
        build_target_graph(model, (0, 1, 2), out, fused=fused)
        counts[fused] = len(onnx.load(out / "target.onnx", load_external_data=False).graph.node)
        meta = {"graph": "target.onnx", "feature_layers": [0, 1, 2], "max_positions": 128, "tied": True}
        target = OnnxTarget(
            "tiny",
            out,
            model.spec,
            _char_tokenizer(),
            ort.InferenceSession(str(out / "target.onnx"), session_options(1)),
            meta,
            128,
            (VOCAB - 1,),
        )
        outs[fused] = target.forward(tokens, torch.zeros(2, dtype=torch.long), None, feature_layers=(0, 1, 2))
    assert counts[True] < counts[False]
    torch.testing.assert_close(outs[True].logits, outs[False].logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[True].features, outs[False].features, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block_size", [16, 64, 128])  # 128 > K = 64: one zero-padded block per row
def test_int4_block_sizes_pad_short_rows_and_stay_close(tmp_path, block_size):
    _, model = _tiny_decoder()
    build_target_graph(model, (), tmp_path, "int4", block_size=block_size)
    graph = onnx.load(tmp_path / "target.onnx", load_external_data=False)
    assert {
        a.i for n in graph.graph.node if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "block_size"
    } == {block_size}
    meta = {"graph": "target.onnx", "feature_layers": [], "max_positions": 128, "tied": True}
    target = OnnxTarget(
        "tiny",
        tmp_path,
        model.spec,
        _char_tokenizer(),
        ort.InferenceSession(str(tmp_path / "target.onnx"), session_options(1)),
        meta,
        128,
        (VOCAB - 1,),
    )
    tokens = torch.randint(0, VOCAB, (1, 16))
    want = model(tokens, torch.zeros(1, dtype=torch.long), None, logits="all").logits
    got = target.forward(tokens, torch.zeros(1, dtype=torch.long), None, logits="all").logits
    assert got is not None and want is not None
    assert torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0) > 0.97
    from export.onnx.graph import quantize_int4

    with pytest.raises(ValueError, match="block size must be one of"):
        quantize_int4(np.zeros((4, 64), np.float32), 48)


def test_missing_feature_layers_are_refused_with_the_fix(tmp_path):
    target, _ = _onnx_target(tmp_path, layers=(1,))
    with pytest.raises(ValueError, match=r"export it with the draft"):
        target.forward(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, dtype=torch.long), feature_layers=(0,))


def test_families_the_graph_cannot_describe_are_refused():
    from deepspec.models.arch import ArchSpec

    gemma = ArchSpec(
        "gemma3_text",
        64,
        64,
        2,
        4,
        1,
        16,
        128,
        1e-6,
        1e4,
        True,
        128,
        qk_norm=True,
        gemma_norms=True,
        sandwich_norms=True,
        sliding_windows=(512, 0),
    )
    with pytest.raises(UnsupportedTarget, match="gemma3_text.*--format pytorch"):
        check_supported(gemma)


def test_quantize_int4_round_trips_within_one_step():
    from export.onnx.graph import INT4_BLOCK, quantize_int4

    w = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    packed, scales, zeros = quantize_int4(w)
    codes = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(8, 64).astype(np.float32)
    zp = np.stack([zeros & 0x0F, zeros >> 4], axis=-1).reshape(8, -1)[:, : 64 // INT4_BLOCK].astype(np.float32)
    scale = scales.reshape(8, -1)
    back = (codes - np.repeat(zp, INT4_BLOCK, axis=1)) * np.repeat(scale, INT4_BLOCK, axis=1)
    assert np.all(np.abs(back - w) <= np.repeat(scale, INT4_BLOCK, axis=1) * 0.5 + 1e-6)


# ---- the real default target -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_onnx(tmp_path_factory, smollm2):
    out = tmp_path_factory.mktemp("onnx-fp32")
    export_onnx(smollm2, "none", out, "float32", "none")
    return out


@pytest.mark.slow
@pytest.mark.timeout(2400)  # two engines over 20 prompts in fp32: minutes on 2 shared cores
def test_fp32_onnx_engine_is_token_identical_to_the_pytorch_engine_on_20_eval_prompts(smollm2, smollm2_onnx):
    from tests.conftest import eval_prompts

    texts = [t for name in ("humaneval", "gsm8k", "mbpp", "math500") for t in eval_prompts(name, 5)]
    prompts = [smollm2.encode_chat([{"role": "user", "content": t}]) for t in texts]
    params = SamplingParams(max_tokens=24)
    target = load_onnx_target(smollm2_onnx, max_seq_len=1024)
    assert target.fingerprint() == smollm2.fingerprint()
    # the reference in one batch (one weight read per step); the ONNX engine in batches of 4 with drafts
    want = SpecEngine(smollm2, None, max_batch_size=len(prompts), max_seq_len=1024).generate(prompts, params)
    got = SpecEngine(target, build_drafter("prompt-lookup", target), max_batch_size=4, max_seq_len=1024).generate(
        prompts, params
    )
    assert [r.token_ids for r in got] == [r.token_ids for r in want]


@pytest.mark.slow
def test_int4_export_of_the_default_target_decodes_sensibly(tmp_path, smollm2):
    export_onnx(smollm2, "none", tmp_path, "float32", "int4")
    meta = json.loads((tmp_path / "onnx.json").read_text())
    assert meta["quantization"] == "int4"
    target = load_onnx_target(tmp_path, max_seq_len=512)
    prompt = target.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    result = SpecEngine(target, None, max_batch_size=1, max_seq_len=512).generate(
        [prompt], SamplingParams(max_tokens=16)
    )[0]
    assert "Paris" in result.text


def test_verify_graph_ends_in_the_plugins_greedy_accept_node(tmp_path):
    pytest.importorskip("onnxruntime_extensions")
    from export.onnx.graph import build_verify_graph
    from plugins.onnx_ops import session_options as plugin_options

    target, model = _onnx_target(tmp_path, layers=())
    build_verify_graph(tmp_path)
    graph = onnx.load(tmp_path / "target_verify.onnx", load_external_data=False)
    node = graph.graph.node[-1]
    assert (node.op_type, node.domain) == ("greedy_accept", "ai.onnx.contrib")
    assert {a.name for a in node.attribute} >= {"plugin_namespace", "plugin_version", "aot"}
    options = plugin_options()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(tmp_path / "target_verify.onnx"), options)
    B, k, S = 2, 4, 32
    cache = target.new_cache(B, S)
    tokens = torch.randint(0, VOCAB, (B, k + 1))
    num_drafts = torch.tensor([4, 2])
    feeds = {
        "input_ids": tokens.numpy(),
        "seqlens_k": np.full(B, k, np.int32),
        "total_sequence_length": np.array(k + 1, np.int32),
        "logits_index": np.broadcast_to(np.arange(k + 1), (B, k + 1)).copy(),
        "num_draft_tokens": num_drafts.numpy(),
    }
    for i in range(model.spec.num_layers):
        feeds[f"past_key.{i}"], feeds[f"past_value.{i}"] = cache.k[i].numpy(), cache.v[i].numpy()
    logits, num_accepted, next_token = session.run(["logits", "num_accepted", "next_token"], feeds)
    argmax = torch.from_numpy(logits).argmax(-1)  # [B, k+1]
    for b in range(B):  # accepted = drafts matching the target's argmax up to the first miss, within num_drafts
        matches = (tokens[b, 1:] == argmax[b, :k]).tolist()[: int(num_drafts[b])] + [False]
        accepted = matches.index(False)
        assert (num_accepted[b], next_token[b]) == (accepted, int(argmax[b, accepted]))


def test_verify_graph_accepts_the_targets_own_argmax(tmp_path):
    """A negative control for the test above: drafts equal to the argmax must all be accepted."""
    pytest.importorskip("onnxruntime_extensions")
    from export.onnx.graph import build_verify_graph
    from plugins.onnx_ops import session_options as plugin_options

    target, model = _onnx_target(tmp_path, layers=())
    build_verify_graph(tmp_path)
    session = ort.InferenceSession(str(tmp_path / "target_verify.onnx"), plugin_options())
    k = 3
    tokens = torch.randint(0, VOCAB, (1, 1))
    start = torch.zeros(1, dtype=torch.long)
    for _ in range(k):  # greedy-decode k tokens with the PyTorch decoder: they are the drafts
        step = model(tokens, start, None, logits="last").logits.argmax(-1)
        tokens = torch.cat([tokens, step], dim=1)
    cache = target.new_cache(1, 16)
    feeds = {
        "input_ids": tokens.numpy(),
        "seqlens_k": np.array([k], np.int32),
        "total_sequence_length": np.array(k + 1, np.int32),
        "logits_index": np.arange(k + 1)[None],
        "num_draft_tokens": np.array([k]),
    }
    for i in range(model.spec.num_layers):
        feeds[f"past_key.{i}"], feeds[f"past_value.{i}"] = cache.k[i].numpy(), cache.v[i].numpy()
    (num_accepted,) = session.run(["num_accepted"], feeds)
    assert num_accepted.tolist() == [k]
