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
        torch.testing.assert_close(
            packed(tokens, torch.zeros(2, dtype=torch.long)).logits,
            plain(tokens, torch.zeros(2, dtype=torch.long)).logits,
            atol=0,
            rtol=0,
        )


# ---- token trees (deepspec/models/tree_attention.py) ------------------------------------------------------------
#: root 0; 1 and 2 follow the root; 3 follows 1, 4 follows 3, 5 follows 2
TREE = torch.tensor([[-1, 0, 0, 1, 3, 2]])


def _paths(parents: list[int]) -> list[list[int]]:
    """Root-to-node index paths of a parent list."""
    paths = []
    for i, p in enumerate(parents):
        paths.append([i] if p < 0 else paths[p] + [i])
    return paths


def test_tree_mask_and_positions_on_a_hand_built_tree():
    from deepspec.models.tree_attention import ancestors, depths, tree_visibility

    anc = ancestors(TREE)
    depth = depths(anc)
    assert depth.tolist() == [[0, 1, 1, 2, 3, 2]]
    # row with 3 committed keys (positions 0-2), the tree written at 3..8, one unused key 9
    visible = tree_visibility(anc, depth, torch.tensor([3]), num_keys=10)[0].int().tolist()
    assert visible == [
        # committed   tree nodes 0..5   unused
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 0],  # root sees the context and itself
        [1, 1, 1, 1, 1, 0, 0, 0, 0, 0],  # 1: root, 1
        [1, 1, 1, 1, 0, 1, 0, 0, 0, 0],  # 2: root, 2 (not its sibling 1)
        [1, 1, 1, 1, 1, 0, 1, 0, 0, 0],  # 3: root, 1, 3
        [1, 1, 1, 1, 1, 0, 1, 1, 0, 0],  # 4: root, 1, 3, 4
        [1, 1, 1, 1, 0, 1, 0, 0, 1, 0],  # 5: root, 2, 5 (not 3 or 4 at lower indices)
    ]
    # a sliding window of 2 positions counts RoPE positions (start + depth), not node indices: node 5 sits at 3 + 2
    # and sees positions 4 and 5 only, i.e. node 2 (position 4) and itself, although node 2 is 3 slots away
    windowed = tree_visibility(anc, depth, torch.tensor([3]), num_keys=10, window=2)[0].int().tolist()
    assert windowed[5] == [0, 0, 0, 0, 0, 1, 0, 0, 1, 0]
    assert windowed[0] == [0, 0, 1, 1, 0, 0, 0, 0, 0, 0]


@pytest.mark.parametrize("batch", [1, 2])
def test_tree_forward_scores_every_path_as_its_own_causal_sequence(tiny_target, batch):
    """Each node's logits and features equal a plain causal forward over context + its root-to-node path; the
    entries land at start + node index. Two rows have different contexts, trees and starts."""
    target, _ = tiny_target
    gen = torch.Generator().manual_seed(5)
    contexts = [torch.randint(0, 16, (n,), generator=gen).tolist() for n in (7, 4)][:batch]
    parents = torch.cat([TREE, torch.tensor([[-1, 0, 1, 1, 0, 4]])])[:batch]
    nodes = torch.randint(0, 16, (batch, 6), generator=gen)
    cache = KVCache(target.spec, batch, 64, torch.float32)
    with torch.no_grad():
        for b, ctx in enumerate(contexts):
            target.forward(torch.tensor([ctx]), torch.tensor([0]), cache.rows(b, 1))
        start = torch.tensor([len(c) for c in contexts])
        out = target.forward(nodes, start, cache.rows(0, batch), feature_layers=(1,), tree_parents=parents)
        for b, ctx in enumerate(contexts):
            for i, path in enumerate(_paths(parents[b].tolist())):
                seq = torch.tensor([ctx + nodes[b, path].tolist()])
                ref = target.forward(seq, torch.tensor([0]), feature_layers=(1,))
                torch.testing.assert_close(out.logits[b, i], ref.logits[0, -1], atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(out.features[b, i], ref.features[0, -1], atol=1e-5, rtol=1e-5)
                # the node's key entry is the one a causal pass puts at its depth, written at start + i
                ref_cache = KVCache(target.spec, 1, 64, torch.float32)
                target.forward(seq, torch.tensor([0]), ref_cache.rows(0, 1))
                torch.testing.assert_close(
                    cache.k[:, b, :, len(ctx) + i], ref_cache.k[:, 0, :, seq.shape[1] - 1], atol=1e-5, rtol=1e-5
                )


def test_a_chain_given_as_a_tree_equals_the_causal_forward(tiny_target):
    target, _ = tiny_target
    tokens = torch.randint(0, 16, (2, 5))
    with torch.no_grad():
        plain = target.forward(tokens, torch.zeros(2, dtype=torch.long)).logits
        chain = torch.tensor([[-1, 0, 1, 2, 3]] * 2)
        tree = target.forward(tokens, torch.zeros(2, dtype=torch.long), tree_parents=chain).logits
    torch.testing.assert_close(tree, plain, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "parents, message", [([[0, 0, 1]], "-1 at column 0"), ([[-1, 0, 2]], "parents"), ([[-1, 1, 0]], "parents")]
)
def test_a_malformed_tree_is_refused(tiny_target, parents, message):
    target, _ = tiny_target
    with pytest.raises(ValueError, match=message):
        target.forward(torch.zeros(1, 3, dtype=torch.long), torch.tensor([0]), tree_parents=torch.tensor(parents))


def test_keep_path_moves_the_accepted_nodes_next_to_the_prefix(tiny_target):
    """After a tree pass and compaction, a step after the committed path gives the logits of a fresh prefill."""
    target, _ = tiny_target
    gen = torch.Generator().manual_seed(9)
    ctx = torch.randint(0, 16, (1, 6), generator=gen)
    nodes = torch.randint(0, 16, (1, 6), generator=gen)
    cache = KVCache(target.spec, 1, 64, torch.float32)
    path, n = torch.tensor([[0, 2, 5, -1, -1, -1]]), torch.tensor([2])  # root → 2 → 5
    nxt = torch.tensor([[3]])
    with torch.no_grad():
        target.forward(ctx, torch.tensor([0]), cache.rows(0, 1))
        target.forward(nodes, torch.tensor([6]), cache.rows(0, 1), tree_parents=TREE)
        cache.keep_path(torch.tensor([6]), path, n)
        after = target.forward(nxt, torch.tensor([9]), cache.rows(0, 1)).logits
        fresh = target.forward(torch.cat([ctx, nodes[:, [0, 2, 5]], nxt], 1), torch.tensor([0])).logits[:, -1:]
    torch.testing.assert_close(after, fresh, atol=1e-5, rtol=1e-5)
