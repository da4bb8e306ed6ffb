"""The Eagle3 draft in the native library (deepspec/models/native/eagle3.py): the PyTorch draft's step with the native
matmuls' quantization and float16 cache entries simulated, on every kernel build this CPU runs; each pair computed
from its own inputs and the entries it sees only (rows, slots, a rolled-back speculative chain: bit for bit); and bad
input refused with a clear error."""

from __future__ import annotations

import ctypes

import pytest
import torch
import torch.nn.functional as F

from deepspec.models.drafts.eagle3 import Eagle3Draft
from deepspec.models.drafts.layers import Attention
from deepspec.models.native import native_target_from
from deepspec.models.native.build import Config
from deepspec.models.native.eagle3 import NativeEagle3, _draft_tables, native_eagle3
from deepspec.models.native.target import ModelHandle
from deepspec.models.q4_weights import dequantize_q4, quantize_q4
from tests.deepspec.models.test_native import KERNELS, _q4_linear, _quantized_linear
from tests.training.helpers import tiny_draft, tiny_target

N = 48  # the draft vocabulary (the head's rows: int8 in both formats)
#: (layout, extra config): the shipped layout; the deepspec one with norm_before_residual, q/k norms and biases
VARIANTS = [
    ("canonical", {}),
    ("deepspec", {"norm_before_residual": True, "qk_norm": True, "qkv_bias": True}),
]


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def libraries(tmp_path_factory):
    from deepspec.models.native.build import library_for

    folder = tmp_path_factory.mktemp("native-draft-kernels")
    return {march: library_for(march, folder) for march in KERNELS if march != "native"}


def _draft(target, layout: str = "canonical", **extra):
    draft = tiny_draft(target, "eagle3", draft_vocab_size=N, layout=layout, **extra).eval()
    with torch.no_grad():  # random norms and biases, so one applied to the wrong tensor shows
        for name, p in draft.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(torch.rand_like(p) * 0.5)
    return draft


def _simulated(weights: str):
    """F.linear as the native matmuls compute it: the head (N rows) int8 in both formats, the rest in `weights`."""

    def linear(x, weight, bias=None):
        if weights == "q4" and weight.shape[0] != N:
            return _q4_linear(x, weight, bias)
        return _quantized_linear(x, weight, bias)

    return linear


def _half_key_value(key_value):
    """Attention.key_value with each k and v rounded to float16, as the native cache stores them."""

    def rounded(self, x, positions):
        k, v = key_value(self, x, positions)
        return k.half().float(), v.half().float()

    return rounded


@pytest.mark.parametrize("weights", ["int8", "q4"])
@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize(("layout", "extra"), VARIANTS, ids=[v[0] for v in VARIANTS])
def test_a_draft_step_is_the_pytorch_step_with_its_quantized_matmuls(
    target, libraries, monkeypatch, weights, kernels, layout, extra
):
    draft = _draft(target, layout, **extra)
    native = native_eagle3(draft, weights=weights, num_threads=2, max_positions=64, library=libraries.get(kernels))
    monkeypatch.setattr(F, "linear", _simulated(weights))
    monkeypatch.setattr(Attention, "key_value", _half_key_value(Attention.key_value))
    cfg = draft.cfg
    B, m, slots, entries = 2, 6, 3, 32
    rows = torch.tensor([2, 0])
    features = torch.randn(B, m + 2, cfg.feature_size)  # wider than m: read in place, not copied
    tokens = torch.randint(0, cfg.vocab_size, (B, m))
    positions = torch.tensor([[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5]])
    want_k = torch.zeros(slots, cfg.num_kv_heads, entries, cfg.head_dim)
    want_v = want_k.clone()
    got_k, got_v = native.new_cache(slots, entries)

    def close(got, want):
        torch.testing.assert_close(got, want, atol=1e-2 if weights == "q4" else 5e-3, rtol=2e-3)

    with torch.no_grad():  # the committed pairs, from the target's features
        want = draft.cached_step(draft.fc(features[:, :m]), tokens, positions, want_k, want_v, rows)
        got, logits = native.step(None, tokens, positions, got_k, got_v, rows, features=features, logits=True)
        close(got, want)
        close(logits, draft.logits(want))
        close(got_k.float(), want_k)
        # a chain step on the outputs, attending over what the first step wrote
        h, nxt, at = want[:, -1:], torch.randint(0, cfg.vocab_size, (B, 1)), positions[:, -1:] + 1
        want = draft.cached_step(h, nxt, at, want_k, want_v, rows)
        got, logits = native.step(h, nxt, at, got_k, got_v, rows, logits=True)
        close(got, want)
        close(logits, draft.logits(want))
        # a tree depth: two siblings at one position in their own entries, each seeing the committed ones and itself
        h2, sib = want.expand(B, 2, -1).contiguous(), torch.randint(0, cfg.vocab_size, (B, 2))
        index = torch.tensor([[7, 8], [7, 8]])
        visible = torch.zeros(B, 2, 9, dtype=torch.bool)
        visible[:, :, :7] = True
        visible[:, 0, 7] = visible[:, 1, 8] = True
        sib_at = torch.full((B, 2), 7)
        want = draft.cached_step(h2, sib, sib_at, want_k, want_v, rows, cache_index=index, visible=visible)
        got = native.cached_step(h2, sib, sib_at, got_k, got_v, rows, cache_index=index, visible=visible)
        close(got, want)
        close(native.logits(got), draft.logits(want))


def test_auto_takes_a_q4_drafts_own_blocks_head_included(target, monkeypatch):
    """A draft whose every matrix is on 4-bit blocks (shipped in q4) runs on those blocks, its head too; a float draft
    keeps int8."""
    draft = _draft(target)
    assert native_eagle3(draft, num_threads=1, max_positions=16).weights == "int8"
    with torch.no_grad():
        for p in draft.parameters():
            if p.ndim == 2:
                p.copy_(torch.from_numpy(dequantize_q4(*quantize_q4(p.numpy()))))
    native = native_eagle3(draft, num_threads=1, max_positions=16)
    assert native.weights == "q4"
    monkeypatch.setattr(F, "linear", _q4_linear)  # every matrix, the head (48 rows here) included
    monkeypatch.setattr(Attention, "key_value", _half_key_value(Attention.key_value))
    cfg = draft.cfg
    features, tokens = torch.randn(1, 4, cfg.feature_size), torch.randint(0, cfg.vocab_size, (1, 4))
    positions, rows = torch.arange(4)[None], torch.tensor([0])
    want_k = torch.zeros(1, cfg.num_kv_heads, 8, cfg.head_dim)
    got_k, got_v = native.new_cache(1, 8)
    with torch.no_grad():
        want = draft.cached_step(draft.fc(features), tokens, positions, want_k, want_k.clone(), rows)
        got, logits = native.step(None, tokens, positions, got_k, got_v, rows, features=features, logits=True)
        torch.testing.assert_close(got, want, atol=1e-2, rtol=2e-3)
        torch.testing.assert_close(logits, draft.logits(want), atol=1e-2, rtol=2e-3)


def test_each_pair_is_computed_from_its_own_inputs_bit_for_bit(target):
    """Rows together = each alone, in any slot; a speculative chain rolled back by re-feeding the committed pairs
    leaves the next step as if it had never been drafted (its entries are overwritten or out of sight)."""
    draft = _draft(target)
    native = native_eagle3(draft, num_threads=2, max_positions=64)
    cfg = draft.cfg
    features = torch.randn(2, 5, cfg.feature_size)
    tokens = torch.randint(0, cfg.vocab_size, (2, 5))
    positions = torch.arange(5)[None].expand(2, 5)
    together_k, together_v = native.new_cache(4, 32)
    both, _ = native.step(None, tokens, positions, together_k, together_v, torch.tensor([3, 1]), features=features)
    for b, slot in enumerate((0, 2)):
        alone_k, alone_v = native.new_cache(4, 32)
        alone_k.fill_(float("nan"))  # no other entry is read
        alone_v.fill_(float("nan"))
        one, _ = native.step(
            None,
            tokens[b : b + 1],
            positions[b : b + 1],
            alone_k,
            alone_v,
            torch.tensor([slot]),
            features=features[b : b + 1],
        )
        assert torch.equal(one, both[b : b + 1])
        assert torch.equal(alone_k[slot, :, :5], together_k[(3, 1)[b], :, :5])

    # row 0 drafts 3 speculative tokens (entries 5-7), then 1 is accepted: the commit re-feeds 2 pairs at 5-6
    k, v = together_k.clone(), together_v.clone()
    h, slot = both[:1, -1:], torch.tensor([3])
    for step in range(3):
        h, _ = native.step(h, torch.randint(0, cfg.vocab_size, (1, 1)), torch.tensor([[5 + step]]), k, v, slot)
    committed = torch.randn(1, 2, cfg.feature_size), torch.randint(0, cfg.vocab_size, (1, 2))
    clean_k, clean_v = together_k.clone(), together_v.clone()
    at = torch.tensor([[5, 6]])
    after, _ = native.step(None, committed[1], at, k, v, slot, features=committed[0])
    clean, _ = native.step(None, committed[1], at, clean_k, clean_v, slot, features=committed[0])
    assert torch.equal(after, clean)
    nxt = torch.tensor([[7]])
    a, la = native.step(after[:, -1:], committed[1][:, -1:], nxt, k, v, slot, logits=True)
    c, lc = native.step(clean[:, -1:], committed[1][:, -1:], nxt, clean_k, clean_v, slot, logits=True)
    assert torch.equal(a, c) and la is not None and lc is not None and torch.equal(la, lc)


def test_the_greedy_chain_in_one_call_is_the_step_by_step_chain(target):
    draft = _draft(target)
    native = native_eagle3(draft, num_threads=2, max_positions=64)
    cfg = draft.cfg
    caches = native.new_cache(3, 32), native.new_cache(3, 32)
    rows, tokens = torch.tensor([2, 0]), torch.randint(0, cfg.vocab_size, (2, 5))
    features = torch.randn(2, 5, cfg.feature_size)
    for k, v in caches:
        h, _ = native.step(None, tokens, torch.arange(5)[None].expand(2, 5), k, v, rows, features=features)
    at = torch.tensor([5, 5])
    chain, no_probs = native.chain(h[:, -1], at, *caches[0], rows, 4)
    assert no_probs is None
    state, ids = h[:, -1:], []
    logits = native.logits(state[:, 0])
    for step in range(4):
        ids.append(draft.d2t[logits.argmax(-1)])
        if step < 3:
            state, out = native.step(state, ids[-1][:, None], at[:, None] + step, *caches[1], rows, logits=True)
            assert out is not None
            logits = out[:, 0]
    assert torch.equal(chain, torch.stack(ids, dim=1))
    assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])
    with pytest.raises(ValueError, match="positions must be in"):
        native.chain(h[:, -1], torch.tensor([30, 5]), *caches[0], rows, 4)


def test_a_sampled_chain_draws_each_token_from_the_distribution_it_returns(target):
    """Row 0 greedy, row 1 at temperature 0.7: row 0's ids are the greedy chain's; each of row 1's is the token at its
    uniform in the running sum of the distribution returned for it, the first one softmax(head(h) / 0.7)."""
    draft = _draft(target)
    native = native_eagle3(draft, num_threads=2, max_positions=64)
    cfg = draft.cfg
    rows, tokens = torch.tensor([1, 0]), torch.randint(0, cfg.vocab_size, (2, 4))
    features = torch.randn(2, 4, cfg.feature_size)
    caches = native.new_cache(2, 32), native.new_cache(2, 32)
    for k, v in caches:
        h, _ = native.step(None, tokens, torch.arange(4)[None].expand(2, 4), k, v, rows, features=features)
    at, temperature, uniform = torch.tensor([4, 4]), torch.tensor([0.0, 0.7]), torch.rand(2, 5)
    greedy, _ = native.chain(h[:, -1], at, *caches[0], rows, 5)
    ids, q = native.chain(h[:, -1], at, *caches[1], rows, 5, temperature, uniform)
    assert q is not None and q.shape == (2, 5, N)
    assert torch.equal(ids[0], greedy[0])
    torch.testing.assert_close(q.sum(-1), torch.ones(2, 5))
    torch.testing.assert_close(q[1, 0], torch.softmax(native.logits(h[1, -1]) / 0.7, -1), atol=1e-6, rtol=1e-4)
    for s in range(5):
        j = int(draft.t2d[ids[1, s]])
        below, through = q[1, s, :j].sum(), q[1, s, : j + 1].sum()
        assert q[1, s, j] > 0 and below <= uniform[1, s] + 1e-5 and uniform[1, s] <= through + 1e-5
    again, _ = native.chain(h[:, -1], at, *caches[1], rows, 5, temperature, uniform)
    assert torch.equal(again, ids)
    with pytest.raises(ValueError, match="needs both"):
        native.chain(h[:, -1], at, *caches[1], rows, 5, temperature)


def test_bad_input_is_a_clear_error(target):
    draft = _draft(target)
    native = native_eagle3(draft, num_threads=1, max_positions=16)
    cfg = draft.cfg
    k, v = native.new_cache(2, 8)
    h = torch.randn(1, 1, cfg.hidden_size)
    tok, pos, rows = torch.tensor([[3]]), torch.tensor([[2]]), torch.tensor([0])
    cases = {
        "h must be": lambda: native.step(torch.randn(1, 1, 5), tok, pos, k, v, rows),
        "tokens must be in": lambda: native.step(h, torch.tensor([[cfg.vocab_size]]), pos, k, v, rows),
        "positions must have shape": lambda: native.step(h, tok, torch.tensor([2]), k, v, rows),
        "positions must be in": lambda: native.step(h, tok, torch.tensor([[16]]), k, v, rows),
        "below the cache": lambda: native.step(h, tok, torch.tensor([[9]]), k, v, rows),
        "rows must be in": lambda: native.step(h, tok, pos, k, v, torch.tensor([2])),
        "cache_index must be in": lambda: native.step(h, tok, pos, k, v, rows, torch.tensor([[8]])),
        "visible must be": lambda: native.step(h, tok, pos, k, v, rows, None, torch.ones(1, 1, 9, dtype=torch.bool)),
        "features must be": lambda: native.step(None, tok, pos, k, v, rows, features=torch.randn(1, 1, 7)),
        "float16 KV cache": lambda: native.step(h, tok, pos, k.float(), v.float(), rows),
        "hidden states must be": lambda: native.logits(torch.randn(2, 3)),
    }
    for message, call in cases.items():
        with pytest.raises(ValueError, match=message):
            call()
    with pytest.raises(ValueError, match="weights must be one of"):
        native_eagle3(draft, weights="int4")
    with pytest.raises(RuntimeError, match="not attached"):
        native_eagle3(Eagle3Draft(draft.cfg))


def test_a_draft_without_its_weights_is_refused_not_run(target):
    """A model handle whose weights were never loaded (the library checks before it reads any)."""
    from deepspec.models.native.build import load_library

    draft = _draft(target)
    lib, cfg = load_library(), draft.cfg
    config = Config(hidden=cfg.hidden_size, layers=1, heads=cfg.num_heads, kv_heads=cfg.num_kv_heads)
    config.head_dim, config.inter, config.vocab, config.max_positions, config.threads = cfg.head_dim, 64, N, 16, 1
    empty = NativeEagle3(
        draft, ModelHandle(lib, lib.ds_model_new(ctypes.byref(config))), _draft_tables(draft, 16), "int8"
    )
    k, v = empty.new_cache(1, 8)
    with pytest.raises(ValueError, match="missing a weight"):
        empty.step(
            torch.randn(1, 1, cfg.hidden_size), torch.tensor([[1]]), torch.tensor([[0]]), k, v, torch.tensor([0])
        )
    with pytest.raises(ValueError, match="missing a weight"):
        empty.logits(torch.randn(1, cfg.hidden_size))


@pytest.mark.slow
def test_the_shipped_draft_picks_the_pytorch_drafts_tokens_on_real_features(smollm2, monkeypatch):
    """The shipped Eagle3 draft on real target features of a real prompt: the native step's logits are the PyTorch
    step's with the native quantization simulated, and its greedy draft tokens the same at every position."""
    from deepspec.models.drafts import load_draft
    from deepspec.paths import drafts_dir
    from tests.conftest import eval_prompts

    native_target = native_target_from(smollm2, num_threads=2)
    draft = load_draft(drafts_dir() / "smollm2-135m-eagle3", native_target)
    native = native_eagle3(draft, num_threads=2, max_positions=512)
    prompt = native_target.encode_chat([{"role": "user", "content": eval_prompts("humaneval", 1)[0]}])
    tokens = torch.tensor([prompt])
    out = native_target.forward(tokens, torch.zeros(1, dtype=torch.long), feature_layers=draft.cfg.feature_layers)
    assert out.features is not None and out.logits is not None
    next_tokens = torch.cat([tokens[:, 1:], out.logits[:, -1:].argmax(-1)], dim=1)  # the pair (F[p], x[p + 1])
    T = tokens.shape[1]
    positions = torch.arange(T)[None]
    got_k, got_v = native.new_cache(1, T)
    got, got_logits = native.step(
        None, next_tokens, positions, got_k, got_v, torch.tensor([0]), features=out.features, logits=True
    )
    # the draft as shipped in 4-bit blocks runs on them, head included (auto); a draft off them on int8
    monkeypatch.setattr(F, "linear", _q4_linear if native.weights == "q4" else _simulated("int8"))
    monkeypatch.setattr(Attention, "key_value", _half_key_value(Attention.key_value))
    want_k = torch.zeros(1, draft.cfg.num_kv_heads, T, draft.cfg.head_dim)
    with torch.no_grad():
        want = draft.cached_step(
            draft.fc(out.features), next_tokens, positions, want_k, want_k.clone(), torch.tensor([0])
        )
        want_logits = draft.logits(want)
    assert got_logits is not None
    assert (got_logits - want_logits).abs().mean() < 1e-2 * want_logits.abs().mean()
    assert torch.equal(got_logits.argmax(-1), want_logits.argmax(-1))
