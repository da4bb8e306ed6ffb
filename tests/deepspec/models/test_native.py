"""The native CPU decoder (deepspec/models/native): the same model as the PyTorch decoder with int8 weights and
per-row int8 activations, or 4-bit block weights and per-block activations, and bit-exact row invariance (a verify
pass = one-token steps, a row alone = the row in a batch, a tree path = its chain), which is what makes speculative
output equal target-only output."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch
from transformers import PreTrainedTokenizerBase

import deepspec.models.decoder as decoder_module
from deepspec.models.int8_weights import quantize_int8
from deepspec.models.kv_cache import KVCache
from deepspec.models.native import NativeTarget, NativeUnavailable, native_target_from
from deepspec.models.native.target import layer_weights
from deepspec.models.q4_weights import dequantize_q4, exact_q4, quantize_q4
from tests.conftest import CharTokenizer

VOCAB = 96


def _tiny(family: str, seed: int = 0):
    """A random-init DecoderTarget of `family` (float32): every layer kind the native decoder implements."""
    import transformers

    from deepspec.models.arch import arch_spec_from_config
    from deepspec.models.decoder import Decoder
    from deepspec.models.decoder_target import DecoderTarget

    torch.manual_seed(seed)
    sizes: dict[str, Any] = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    if family == "llama-hd64":  # SmolLM2's head size: the chain attention's register tiles of 4 vectors
        config = transformers.LlamaConfig(**{**sizes, "hidden_size": 256}, tie_word_embeddings=True)
        hf = transformers.LlamaForCausalLM(config)
    elif family == "qwen3-hd128":  # the tiles of 8 vectors
        config = transformers.Qwen3Config(**sizes, head_dim=128, tie_word_embeddings=False)
        hf = transformers.Qwen3ForCausalLM(config)
    elif family == "llama":
        config = transformers.LlamaConfig(**sizes, tie_word_embeddings=True)
        hf = transformers.LlamaForCausalLM(config)
    elif family == "qwen2":  # biases on q, k, v
        config = transformers.Qwen2Config(**sizes, tie_word_embeddings=False)
        hf = transformers.Qwen2ForCausalLM(config)
    elif family == "qwen3":  # per-head q/k norms, head_dim apart from hidden / heads
        config = transformers.Qwen3Config(**sizes, head_dim=32, tie_word_embeddings=False)
        hf = transformers.Qwen3ForCausalLM(config)
    else:  # gemma3: sliding windows with their own RoPE base, sandwich norms, GeGLU, scaled embeddings
        config = transformers.Gemma3TextConfig(
            **sizes,
            head_dim=16,
            sliding_window=6,
            query_pre_attn_scalar=16,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        )
        hf = transformers.Gemma3ForCausalLM(config)
    with torch.no_grad():  # random norms, so a norm applied to the wrong tensor shows
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.add_(torch.rand_like(p) * 0.5)
    spec = arch_spec_from_config(config)
    model = Decoder(spec, max_positions=128)
    model.load_hf_state_dict(hf.eval().state_dict(), torch.float32)
    return DecoderTarget(
        family,
        config=config,
        path=Path("."),  # no directory: the model is built here, never loaded
        spec=spec,
        _model=model.eval(),
        tokenizer=cast(PreTrainedTokenizerBase, CharTokenizer(VOCAB)),  # all of a tokenizer the decoder reads
        max_seq_len=128,
        eos_token_ids=(VOCAB - 1,),
    )


def _quantized_linear(x, weight, bias, packed=None):
    """The native decoder's matmul in torch: int8 weights per channel, activations per row to uint8 around 128
    (scale = abs-max / 127 in float32, rounded to nearest even), the integer dot product, then the scales."""
    q, scale = quantize_int8(weight.detach().float().numpy())
    rows = x.float().reshape(-1, x.shape[-1])
    step = rows.abs().amax(-1, keepdim=True) / 127.0
    inv = torch.where(step > 0, 1.0 / step, torch.zeros_like(step))
    xq = torch.round(rows * inv)  # round half to even, as the kernels' conversion
    acc = (xq.double() @ torch.from_numpy(q).double().T).float()
    y = acc * torch.from_numpy(scale) * step
    if bias is not None:
        y = y + bias.float()
    return y.reshape(*x.shape[:-1], -1)


def _q4_linear(x, weight, bias, packed=None):
    """The 4-bit layers' matmul in torch: the weights' blocks dequantized, activations per block of 32 to signed
    int8 (scale = the block's abs-max / 127); the LM head (the only [VOCAB, ...] matrix here) stays int8."""
    if weight.shape[0] == VOCAB:
        return _quantized_linear(x, weight, bias)
    w = torch.from_numpy(dequantize_q4(*quantize_q4(weight.detach().float().numpy())))
    rows = x.float().reshape(-1, x.shape[-1])
    blocks = rows.reshape(rows.shape[0], -1, 32)
    step = blocks.abs().amax(-1, keepdim=True) / 127.0
    inv = torch.where(step > 0, 1.0 / step, torch.zeros_like(step))
    xq = (torch.round(blocks * inv) * step).reshape(rows.shape)
    y = (xq.double() @ w.double().T).float()
    if bias is not None:
        y = y + bias.float()
    return y.reshape(*x.shape[:-1], -1)


def _has(*flags: str) -> bool:
    from pathlib import Path

    cpuinfo = Path("/proc/cpuinfo")
    have = set(cpuinfo.read_text().split()) if cpuinfo.is_file() else set()
    return all(f in have for f in flags)


#: the kernel families each test runs: this CPU's own build, and the AVX2 and portable ones where the CPU runs them
#: (a CI machine may be an AVX2-only EPYC; every family must compute the same model, exactly row-invariant)
KERNELS = ["native"] + (["x86-64-v3", "x86-64"] if _has("avx2", "fma", "bmi2") else [])


@pytest.fixture(scope="module")
def libraries(tmp_path_factory):
    from deepspec.models.native.build import library_for

    folder = tmp_path_factory.mktemp("native-kernels")
    return {march: library_for(march, folder) for march in KERNELS if march != "native"}


#: head sizes of 64 and 128 take the attention's register tiles: the chain path's on AVX-512 (this CPU's own build
#: where it has AVX-512), the weighted sums' on AVX2
WIDE_HEADS = [
    (f, k, w) for k in KERNELS if k != "x86-64" for f in ("llama-hd64", "qwen3-hd128") for w in ("int8", "q4")
]


@pytest.fixture(
    scope="module",
    params=[(f, k, w) for k in KERNELS for f in ("llama", "qwen2", "qwen3", "gemma3") for w in ("int8", "q4")]
    + WIDE_HEADS,
    ids=lambda p: "-".join(p),
)
def pair(request, libraries):
    family, kernels, weights = request.param
    reference = _tiny(family)
    native = native_target_from(reference, num_threads=2, library=libraries.get(kernels), weights=weights)
    assert native.quantization == weights
    assert kernels != "x86-64" or native.isa == "portable"
    assert kernels != "x86-64-v3" or native.isa == "avx2"
    return reference, native


def _half_entries(write_and_read):
    """The reference decoder's cache write with each key and value rounded to float16 (to nearest even, as the native
    cache stores them) and kept in its float32 cache, so its attention math stays float32 as the native one does."""

    def write_half(self, i, k, v, attn_dtype):
        return write_and_read(self, i, k.to(torch.float16).to(k.dtype), v.to(torch.float16).to(v.dtype), attn_dtype)

    return write_half


def test_it_computes_the_decoder_with_its_quantized_matmuls(pair, monkeypatch):
    reference, native = pair
    assert isinstance(native, NativeTarget)
    monkeypatch.setattr(decoder_module, "_linear", _q4_linear if native.quantization == "q4" else _quantized_linear)
    monkeypatch.setattr(
        decoder_module._CacheAccess, "write_and_read", _half_entries(decoder_module._CacheAccess.write_and_read)
    )
    B, layers = 3, (0, 2)
    want_cache, got_cache = KVCache(reference.spec, B, 64, torch.float32), native.new_cache(B, 64)
    tokens = torch.randint(0, VOCAB, (B, 20))
    start = torch.zeros(B, dtype=torch.long)

    # a 32-input block's activation level that float32 and torch's float64 round to different sides of a half
    # (the two paths' norms differ in the last bits) moves the logits after it by up to ~4e-3 at these sizes; a key
    # or value that the two paths' last bits put on either side of a float16 rounding adds up to ~3e-3 more
    tolerance = 8e-3 if native.quantization == "q4" else 3e-3
    # wider rows hold more such levels (and per-row int8 levels coarser ones): there a flip reaches ~1.6e-2, so every
    # element must be within that and the mean difference stay about 1e-3 (a wrong attention or matmul moves most
    # elements by ~1e-1)
    wide = native.spec.hidden_size > 64 or native.spec.head_dim > 32

    def close(got, want, normalized=False):
        """`normalized`: a post-norm state, where the norm's 1/rms scales the residual's last-bit differences up"""
        if not wide and not normalized:
            torch.testing.assert_close(got, want, atol=tolerance, rtol=2e-3)
            return
        torch.testing.assert_close(got, want, atol=5e-2 if normalized else 2.5e-2, rtol=2e-3)
        assert (got - want).abs().mean() < 5e-3

    def check(x, begin, logits):
        want = reference.forward(
            x, begin, want_cache.rows(0, B), feature_layers=layers, logits=logits, return_final_hidden=True
        )
        got = native.forward(
            x, begin, got_cache.rows(0, B), feature_layers=layers, logits=logits, return_final_hidden=True
        )
        close(got.features, want.features)
        close(got.logits, want.logits)
        close(got.final_hidden, want.final_hidden, normalized=True)  # what a draft trained offline reads

    check(tokens[:, :9], start, "last")  # prefill: past gemma3's 6-token window
    check(tokens[:, 9:13], start + 9, "all")  # a verify pass
    for t in range(13, 20):  # one-token steps
        check(tokens[:, t : t + 1], start + t, "all")


def test_a_verify_pass_equals_one_token_steps_bit_for_bit(pair):
    _, native = pair
    B = 3
    prompts = torch.randint(0, VOCAB, (B, 30))
    lengths = [11, 7, 15]
    block = torch.randint(0, VOCAB, (B, 6))
    caches = native.new_cache(B, 64), native.new_cache(B, 64)
    for cache in caches:
        for b, n in enumerate(lengths):
            native.forward(prompts[b : b + 1, :n], torch.zeros(1, dtype=torch.long), cache.rows(b, 1), logits="none")
    start = torch.tensor(lengths)
    together = native.forward(block, start, caches[0].rows(0, B), feature_layers=(1,), logits="all")
    for t in range(block.shape[1]):  # the same tokens one at a time, each row alone
        for b in range(B):
            step = native.forward(
                block[b : b + 1, t : t + 1],
                start[b : b + 1] + t,
                caches[1].rows(b, 1),
                feature_layers=(1,),
                logits="all",
            )
            assert torch.equal(step.logits[0, 0], together.logits[b, t])
            assert torch.equal(step.features[0, 0], together.features[b, t])
    assert torch.equal(caches[0].k, caches[1].k) and torch.equal(caches[0].v, caches[1].v)


def test_each_tree_path_is_scored_as_its_own_chain_bit_for_bit(pair):
    _, native = pair
    prompt = torch.randint(0, VOCAB, (1, 9))
    #          root  a   b   a1  a2  b1
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2]])
    tree = torch.randint(0, VOCAB, (1, 6))
    tree_cache = native.new_cache(1, 64)
    native.forward(prompt, torch.zeros(1, dtype=torch.long), tree_cache.rows(0, 1), logits="none")
    scored = native.forward(tree, torch.tensor([9]), tree_cache.rows(0, 1), logits="all", tree_parents=parents)
    for path in ([0, 1, 3], [0, 1, 4], [0, 2, 5]):
        chain_cache = native.new_cache(1, 64)
        native.forward(prompt, torch.zeros(1, dtype=torch.long), chain_cache.rows(0, 1), logits="none")
        chain = native.forward(tree[:, path], torch.tensor([9]), chain_cache.rows(0, 1), logits="all")
        for depth, node in enumerate(path):
            assert torch.equal(chain.logits[0, depth], scored.logits[0, node]), (path, node)


def _primed_caches(native, prompts, context, count):
    """`count` caches holding each row's context, every other entry NaN: an entry a forward should neither write nor
    read stays NaN, and a read of one turns the outputs that read it into NaN."""
    caches = []
    for _ in range(count):
        cache = native.new_cache(len(context), 32)
        cache.k.fill_(float("nan"))
        cache.v.fill_(float("nan"))
        for b, n in enumerate(context):
            native.forward(prompts[b : b + 1, :n], torch.zeros(1, dtype=torch.long), cache.rows(b, 1), logits="none")
        caches.append(cache)
    return caches


OUTPUTS = ("logits", "features", "final_hidden")


def test_ragged_rows_compute_each_row_as_its_own_forward_bit_for_bit(pair):
    """Row b of a ragged pass computes its first lengths[b] tokens as a forward of those tokens alone and as the
    padded pass does, bit for bit; zeros past them, and its cache entries past them neither written nor read."""
    _, native = pair
    B, T, lengths, context = 3, 4, [1, 4, 2], [7, 5, 9]
    prompts, block = torch.randint(0, VOCAB, (B, 9)), torch.randint(0, VOCAB, (B, T))
    start = torch.tensor(context)
    ragged_cache, padded_cache, alone_cache = _primed_caches(native, prompts, context, 3)
    options: dict[str, Any] = dict(feature_layers=(0, 2), logits="all", return_final_hidden=True)
    ragged = native.forward(block, start, ragged_cache.rows(0, B), row_lengths=torch.tensor(lengths), **options)
    padded = native.forward(block, start, padded_cache.rows(0, B), **options)
    for b, n in enumerate(lengths):
        alone = native.forward(block[b : b + 1, :n], start[b : b + 1], alone_cache.rows(b, 1), **options)
        for name in OUTPUTS:
            got, want, full = getattr(ragged, name)[b], getattr(alone, name)[0], getattr(padded, name)[b]
            assert torch.equal(got[:n], want) and torch.equal(got[:n], full[:n]), (name, b)
            assert torch.equal(got[n:], torch.zeros_like(got[n:])), (name, b)
        end = context[b] + n
        for got, want in ((ragged_cache.k, alone_cache.k), (ragged_cache.v, alone_cache.v)):
            assert torch.equal(got[:, b, :, :end], want[:, b, :, :end])
            assert got[:, b, :, end:].isnan().all()  # past the row's length: never written
    picked = native.forward(  # logits at one position a row: past its row's length, zeros
        block,
        start,
        _primed_caches(native, prompts, context, 1)[0].rows(0, B),
        logits=torch.tensor([0, 3, 1]),
        row_lengths=torch.tensor(lengths),
    ).logits
    assert picked is not None and torch.equal(picked[:, 0], ragged.logits[torch.arange(B), torch.tensor([0, 3, 1])])
    late = native.forward(
        block,
        start,
        _primed_caches(native, prompts, context, 1)[0].rows(0, B),
        logits=torch.tensor([3, 3, 3]),
        row_lengths=torch.tensor(lengths),
    ).logits
    assert late is not None and not late[[0, 2]].any() and torch.equal(late[1, 0], ragged.logits[1, 3])


def test_full_row_lengths_are_the_padded_forward(pair):
    _, native = pair
    prompts, block, context = torch.randint(0, VOCAB, (2, 9)), torch.randint(0, VOCAB, (2, 3)), [4, 6]
    caches = _primed_caches(native, prompts, context, 2)
    options: dict[str, Any] = dict(feature_layers=(1,), return_final_hidden=True)
    start = torch.tensor(context)
    full = native.forward(block, start, caches[0].rows(0, 2), row_lengths=torch.tensor([3, 3]), **options)
    padded = native.forward(block, start, caches[1].rows(0, 2), **options)
    assert all(torch.equal(getattr(full, name), getattr(padded, name)) for name in OUTPUTS)
    for got, want in ((caches[0].k, caches[1].k), (caches[0].v, caches[1].v)):  # bits: the untouched entries are NaN
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_a_ragged_tree_scores_each_row_as_its_first_nodes_alone(pair):
    """Trees with row_lengths: nodes past a row's length are left out (a node's ancestors come before it, so the
    nodes kept are a tree), and the nodes kept score as the tree of them alone does, bit for bit."""
    _, native = pair
    #                          root  a   b   a1  a2  b1
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2], [-1, 0, 1, 0, 3, 3]])
    prompts, tree, context, lengths = torch.randint(0, VOCAB, (2, 9)), torch.randint(0, VOCAB, (2, 6)), [9, 6], [4, 6]
    ragged_cache, alone_cache = _primed_caches(native, prompts, context, 2)
    start = torch.tensor(context)
    ragged = native.forward(
        tree, start, ragged_cache.rows(0, 2), logits="all", tree_parents=parents, row_lengths=torch.tensor(lengths)
    ).logits
    assert ragged is not None
    for b, n in enumerate(lengths):
        alone = native.forward(
            tree[b : b + 1, :n], start[b : b + 1], alone_cache.rows(b, 1), tree_parents=parents[b : b + 1, :n]
        ).logits
        assert alone is not None and torch.equal(ragged[b, :n], alone[0]) and not ragged[b, n:].any()


def test_row_lengths_outside_the_block_are_refused(pair):
    _, native = pair
    cache = native.new_cache(2, 16)
    tokens, start = torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, dtype=torch.long)
    for wrong in ([0, 3], [1, 4], [-1, 2]):
        with pytest.raises(ValueError, match=r"row_lengths must each be in \[1, 3\]"):
            native.forward(tokens, start, cache.rows(0, 2), row_lengths=torch.tensor(wrong))
    with pytest.raises(ValueError, match="one length per row"):
        native.forward(tokens, start, cache.rows(0, 2), row_lengths=torch.tensor([3]))


def test_thread_counts_share_one_pool_and_never_change_a_number(pair):
    """One thread and four threads (the pool grows to the most any model asks for; a model asking for fewer uses
    only as many as it has scratch for) compute what two threads do, bit for bit."""
    reference, native = pair
    tokens = torch.randint(0, VOCAB, (2, 11))
    outputs = []
    for threads in (2, 4, 1):
        target = native_target_from(
            reference, num_threads=threads, library=native._model.lib, weights=native.quantization
        )
        cache = target.new_cache(2, 32)
        target.forward(tokens[:, :6], torch.zeros(2, dtype=torch.long), cache.rows(0, 2), logits="none")
        outputs.append(target.forward(tokens[:, 6:], torch.full((2,), 6), cache.rows(0, 2)).logits)
    assert torch.equal(outputs[0], outputs[1]) and torch.equal(outputs[0], outputs[2])


def test_bad_inputs_are_refused_with_a_message(pair):
    _, native = pair
    cache = native.new_cache(1, 16)
    start = torch.zeros(1, dtype=torch.long)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 96\)"):
        native.forward(torch.tensor([[3, VOCAB]]), start, cache.rows(0, 1))
    with pytest.raises(ValueError, match="exceeds the context window of 16"):
        native.forward(torch.zeros(1, 17, dtype=torch.long), start, cache.rows(0, 1))
    for wrong in (torch.float32, torch.bfloat16):  # a cache made for another target
        with pytest.raises(ValueError, match="float16 KVCache"):
            native.forward(torch.zeros(1, 2, dtype=torch.long), start, KVCache(native.spec, 1, 16, wrong).rows(0, 1))
    with pytest.raises(ValueError, match="feature layers"):
        native.forward(torch.zeros(1, 2, dtype=torch.long), start, cache.rows(0, 1), feature_layers=(3,))
    with pytest.raises(ValueError, match="tree_parents"):
        native.forward(
            torch.zeros(1, 3, dtype=torch.long), start, cache.rows(0, 1), tree_parents=torch.tensor([[-1, 0, 2]])
        )


def test_without_a_compiler_it_says_what_is_missing(monkeypatch, tmp_path):
    from deepspec.models.native import build

    monkeypatch.setattr(build, "_LIBRARY", None)
    monkeypatch.setenv("DEEPSPEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(NativeUnavailable, match="no-such-cc"):
        build.load_library()


def test_quantized_weights_round_trip_within_half_a_step():
    weight = np.random.default_rng(0).standard_normal((8, 40)).astype(np.float32)
    q, scale = quantize_int8(weight)
    assert np.abs(q).max() <= 63
    assert np.all(np.abs(q * scale[:, None] - weight) <= scale[:, None] / 2 + 1e-7)


def test_4bit_blocks_reproduce_weights_that_came_from_them_and_round_others_within_half_a_step():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((8, 64)).astype(np.float32)
    q, d, m = quantize_q4(weight)
    assert q.max() <= 15 and d.dtype == m.dtype == np.float16
    step = np.repeat(d.astype(np.float32), 32, axis=1)
    assert np.all(np.abs(dequantize_q4(q, d, m) - weight) <= step / 2 + 1e-6)
    assert exact_q4(weight) is None
    shipped = dequantize_q4(q, d, m)  # what a GGUF Q4_1 tensor loads as
    assert exact_q4(shipped) is not None
    assert np.array_equal(dequantize_q4(*quantize_q4(shipped)), shipped)
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q4(weight[:, :40])


def test_auto_weights_take_4bit_blocks_only_for_a_model_already_on_them():
    from deepspec.models.decoder_target import pytorch_decoder

    decoder = pytorch_decoder(_tiny("llama"))
    assert layer_weights(decoder) == ("int8", None)  # float weights keep int8's finer steps
    with torch.no_grad():
        for layer in decoder.layers:
            for name in ("wqkv", "wo", "w_gate_up", "w_down"):
                w = getattr(layer, name)
                w.copy_(torch.from_numpy(dequantize_q4(*quantize_q4(w.numpy()))))
    form, blocks = layer_weights(decoder)
    assert blocks is not None
    assert form == "q4" and len(blocks) == 4 * len(decoder.layers)  # the check's blocks, packed as they are
    assert layer_weights(decoder, "int8") == ("int8", None)
    with pytest.raises(ValueError, match="auto, int8, q4"):
        layer_weights(decoder, "int3")


@pytest.mark.parametrize("weights", ["int8", "q4"])
@pytest.mark.parametrize("tree", [False, True], ids=["chains", "trees"])
def test_speculative_greedy_output_is_target_only_output_at_any_batch(tree, weights):
    """Random drafts on a sharp 16-token model are often accepted; every output must still be the native target's own
    target-only output, bit for bit, at batch 1, 3 and 8 (requests joining and leaving mid-run)."""
    from deepspec.decoding import SamplingParams, SpecEngine
    from deepspec.decoding.drafters.random import RandomDrafter
    from tests.conftest import make_tiny_target
    from tests.deepspec.decoding.test_engine import PROMPTS

    native = native_target_from(make_tiny_target(eos=False, temperature=4.0)[0], num_threads=2, weights=weights)
    reference = [
        r.token_ids
        for r in SpecEngine(native, None, max_batch_size=1, max_seq_len=128).generate(
            PROMPTS, SamplingParams(max_tokens=24)
        )
    ]
    for batch in (1, 3, 8):
        engine = SpecEngine(
            native,
            RandomDrafter(16, seed=1, tree=tree),
            max_batch_size=batch,
            max_seq_len=128,
            num_speculative_tokens=6,
        )
        results = engine.generate(PROMPTS, SamplingParams(max_tokens=24))
        assert [r.token_ids for r in results] == reference, batch
        assert sum(r.num_accepted_tokens for r in results) > 0


@pytest.mark.slow
def test_the_default_target_speculates_exactly_with_the_shipped_corpus_draft():
    """SmolLM2 on the native decoder with the default draft: outputs equal its target-only outputs on real prompts,
    alone and three at a time, with drafts accepted."""
    from bench.decode import load_prompts
    from deepspec.decoding import SamplingParams, SpecEngine, build_drafter
    from deepspec.models.native import load_native_target

    native = load_native_target("smollm2-135m")
    assert native.quantization == "q4"  # its layers are GGUF Q4_1 blocks: computed as shipped
    prompts = [p for ps in load_prompts(native, 1).values() for p in ps]
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    reference = [r.token_ids for r in SpecEngine(native, None, max_batch_size=1).generate(prompts, params)]
    for batch in (1, 3):
        engine = SpecEngine(native, build_drafter("auto", native), max_batch_size=batch)
        results = engine.generate(prompts, params)
        assert [r.token_ids for r in results] == reference, batch
        assert sum(r.num_accepted_tokens for r in results) > 10
