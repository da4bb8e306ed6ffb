"""The lean decoder must compute what the Hugging Face forward computes, with and without the KV cache."""

import pytest
import torch

from deepspec.models.kv_cache import KVCache
from tests.conftest import make_tiny_target


def test_full_forward_matches_hf(tiny_target):
    target, hf = tiny_target
    tokens = torch.randint(0, 16, (2, 12))
    with torch.no_grad():
        ours = target.forward(tokens, torch.zeros(2, dtype=torch.long)).logits
        ref = hf(tokens).logits
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_cached_incremental_forward_matches_full(tiny_target):
    target, _ = tiny_target
    tokens = torch.randint(0, 16, (1, 20))
    cache = KVCache(target.spec, 1, 64, torch.float32)
    with torch.no_grad():
        full = target.forward(tokens, torch.zeros(1, dtype=torch.long)).logits
        first = target.forward(tokens[:, :9], torch.tensor([0]), cache.rows(0, 1)).logits
        one = target.forward(tokens[:, 9:10], torch.tensor([9]), cache.rows(0, 1)).logits
        block = target.forward(tokens[:, 10:], torch.tensor([10]), cache.rows(0, 1)).logits
    torch.testing.assert_close(torch.cat([first, one, block], 1), full, atol=1e-5, rtol=1e-5)


def test_rows_with_different_lengths_in_one_batch(tiny_target):
    """Row b writes at its own offset and sees only its own keys (the batched verify pass)."""
    target, _ = tiny_target
    a, b = torch.randint(0, 16, (1, 14)), torch.randint(0, 16, (1, 9))
    cache = KVCache(target.spec, 2, 64, torch.float32)
    with torch.no_grad():
        ref_a = target.forward(a, torch.tensor([0])).logits[:, -4:]
        ref_b = target.forward(b, torch.tensor([0])).logits[:, -4:]
        target.forward(a[:, :10], torch.tensor([0]), cache.rows(0, 1))
        target.forward(b[:, :5], torch.tensor([0]), cache.rows(1, 1))
        both = target.forward(torch.cat([a[:, 10:], b[:, 5:]]), torch.tensor([10, 5]), cache.rows(0, 2)).logits
    torch.testing.assert_close(both[0:1], ref_a, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(both[1:2], ref_b, atol=1e-5, rtol=1e-5)


def test_feature_layers_are_residual_outputs(tiny_target):
    target, hf = tiny_target
    tokens = torch.randint(0, 16, (1, 7))
    with torch.no_grad():
        out = target.forward(tokens, torch.tensor([0]), feature_layers=(0, 1), logits="none")
        hidden = hf(tokens, output_hidden_states=True).hidden_states
    # hidden_states[i + 1] is the raw output of layer i, except the last entry, which HF stores post-norm
    torch.testing.assert_close(out.features[..., :32], hidden[1], atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_real_target_matches_hf_forward(smollm2):
    ids = smollm2.encode_chat([{"role": "user", "content": "Write a python function to add two numbers."}])
    tokens = torch.tensor([ids])
    with torch.no_grad():
        ours = smollm2.forward(tokens, torch.tensor([0])).logits
        ref = smollm2.hf_model()(tokens).logits
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


def test_context_window_is_enforced():
    target, _ = make_tiny_target()
    with pytest.raises(ValueError, match="context window"):
        target.forward(torch.zeros(1, 300, dtype=torch.long), torch.tensor([0]))


def test_prepacked_bf16_weights_give_the_same_logits():
    target, hf = make_tiny_target(hidden=64)
    from deepspec.models.decoder import Decoder

    plain = Decoder(target.spec, max_positions=256)
    plain.load_hf_state_dict(hf.state_dict(), torch.bfloat16)
    packed = Decoder(target.spec, max_positions=256)
    packed.load_hf_state_dict(hf.state_dict(), torch.bfloat16)
    if not packed.prepack():
        pytest.skip("this torch build has no oneDNN bf16 linear")
    tokens = torch.randint(0, 16, (2, 9))
    with torch.inference_mode():
        torch.testing.assert_close(packed(tokens, torch.zeros(2, dtype=torch.long)).logits,
                                   plain(tokens, torch.zeros(2, dtype=torch.long)).logits, atol=0, rtol=0)
