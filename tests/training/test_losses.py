"""Index bookkeeping of the three losses, on hand-built 10-token examples, and that each loss learns."""

from __future__ import annotations

import torch

from deepspec.models.drafts.dflash import block_mask
from deepspec.models.drafts.eagle3 import ttt_mask
from tests.training.helpers import attached_draft_case, target_sequences, tiny_draft, tiny_target
from training.losses import block_targets, eagle3_valid, sample_anchors

X = torch.arange(100, 110)[None]  # x[i] = 100 + i: a label's value names its position
ASSISTANT_FROM_4 = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1, 1, 1]])


def test_block_labels_slot_j_predicts_x_a_plus_1_plus_j():
    anchors, valid_anchor = torch.tensor([[3, 6]]), torch.tensor([[True, True]])
    labels, prev, valid = block_targets(X, ASSISTANT_FROM_4, anchors, valid_anchor, block_size=4)
    assert labels[0, 0].tolist() == [104, 105, 106, 107]  # a=3: x[4..7]
    assert prev[0, 0].tolist() == [103, 104, 105, 106]  # x_{j-1}; x_{-1} is the anchor itself
    assert valid[0, 0].tolist() == [True] * 4
    # a=6: x[7], x[8], x[9], then past the end → the valid prefix stops at 3 slots
    assert labels[0, 1, :3].tolist() == [107, 108, 109]
    assert valid[0, 1].tolist() == [True, True, True, False]


def test_block_valid_prefix_is_contiguous():
    mask = torch.tensor([[0, 0, 0, 0, 1, 1, 0, 1, 1, 1]])  # a user token at position 6 breaks the block
    labels, _, valid = block_targets(X, mask, torch.tensor([[3]]), torch.tensor([[True]]), block_size=5)
    assert valid[0, 0].tolist() == [True, True, False, False, False]


def test_block_never_sees_its_anchor_feature():
    anchors = torch.tensor([[3, 6]])
    mask = block_mask(anchors, num_context=10, block_size=4)[0]  # [8, 10 + 8]
    for i, a in enumerate([3, 6]):
        for j in range(4):
            row = mask[i * 4 + j]
            assert row[:10].tolist() == [p < a for p in range(10)]  # context strictly before the anchor
            assert row[10 + i * 4 : 10 + i * 4 + 4].all()  # its own block, bidirectionally
            other = torch.cat([row[10 : 10 + i * 4], row[10 + i * 4 + 4 :]])
            assert not other.any()  # nothing of other blocks


def test_anchors_come_from_assistant_region():
    g = torch.Generator().manual_seed(0)
    anchors, valid = sample_anchors(ASSISTANT_FROM_4, 10, g)
    real = anchors[valid]
    assert sorted(real.tolist()) == [3, 4, 5, 6, 7, 8]  # x[a+1] assistant and a+1 < T
    assert valid.sum() == 6


def test_eagle3_label_shift_and_mask():
    # step k at t feeds x[t+1+k] and predicts x[t+2+k]: valid iff that token exists and is an assistant token
    assert eagle3_valid(ASSISTANT_FROM_4, 0)[0].tolist() == [t + 2 >= 4 and t + 2 < 10 for t in range(10)]
    assert eagle3_valid(ASSISTANT_FROM_4, 3)[0].tolist() == [t + 5 >= 4 and t + 5 < 10 for t in range(10)]
    m = ttt_mask(4, step=2)  # causal over step-0 keys + the diagonal of steps 1 and 2
    assert m[2].tolist() == [True, True, True, False] + [False, False, True, False] * 2


def test_eagle3_ttt_attention_matches_pattern():
    """Changing a step-0 key at a later position, or another index's step-1 input, must not move index t."""
    target = tiny_target()
    draft = tiny_draft(target, "eagle3").eval()
    torch.manual_seed(0)
    F = torch.randn(1, 10, draft.cfg.feature_size)
    tokens = torch.randint(64, (1, 10))
    base = draft.ttt_forward(F, tokens, 3)
    F2 = F.clone()
    F2[0, 7] += 5.0  # features after position 4 cannot reach index 4 at any step
    moved = draft.ttt_forward(F2, tokens, 3)
    for k in range(3):
        assert torch.allclose(base[k][0, :5], moved[k][0, :5], atol=1e-5)
        assert not torch.allclose(base[k][0, 7], moved[k][0, 7])


def _train_losses(algo: str, steps: int) -> list[float]:
    from training.losses import dflash_loss, dspark_loss, eagle3_loss

    target = tiny_target(temperature=40.0)
    draft = tiny_draft(target, algo)
    seqs = torch.tensor(target_sequences(target, 4, 24))
    mask = torch.ones_like(seqs)
    mask[:, :3] = 0
    out = target.forward(
        seqs,
        torch.zeros(4, dtype=torch.long),
        feature_layers=draft.cfg.feature_layers,
        logits="none",
        return_final_hidden=True,
    )
    opt = torch.optim.AdamW(draft.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(steps):
        if algo == "eagle3":
            loss, _ = eagle3_loss(draft, target, out.features, out.final_hidden, seqs, mask)
        else:
            fn = dflash_loss if algo == "dflash" else dspark_loss
            loss, _ = fn(draft, target, out.features, out.final_hidden, seqs, mask, g, 8)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def test_losses_decrease_within_seconds():
    for algo in ("eagle3", "dflash", "dspark"):
        losses = _train_losses(algo, 40)
        first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
        assert last < 0.8 * first, (algo, first, last)


def _dense_labels_case(algo: str):
    """A draft, its target's features and final hidden state, and the same target distributions as dense
    SoftLabels over the whole draft vocabulary (what --labels target computes with label_top_k = 0)."""
    from training.distill import soft_labels

    target, draft, seqs, mask, out = attached_draft_case(algo, logits="all")
    assert out.logits is not None
    return target, draft, seqs, mask, out, soft_labels(out.logits, draft.d2t, top_k=0)


def _grads(draft, loss):
    draft.zero_grad()
    loss.backward()
    return [p.grad.clone() for p in draft.parameters() if p.grad is not None]


def test_eagle3_distill_loss_trains_exactly_like_the_soft_ce_on_the_same_distributions():
    """Dense labels from the same forward: KL = soft-CE + Σ p log p̂, a constant, so the gradients are equal —
    step k at t reads the distribution at t+1+k in both losses (the shift the regen loss is tested for)."""
    from training.losses import eagle3_distill_loss, eagle3_loss

    target, draft, seqs, mask, out, labels = _dense_labels_case("eagle3")
    regen, _ = eagle3_loss(draft, target, out.features, out.final_hidden, seqs, mask)
    distill, _ = eagle3_distill_loss(draft, labels, out.features, seqs, mask)
    a, b = _grads(draft, regen), _grads(draft, distill)
    assert len(a) == len(b) > 0 and all(torch.allclose(x, y, atol=1e-5) for x, y in zip(a, b))
    assert distill.item() < regen.item()  # the entropy part is gone: a KL, not a cross-entropy


def test_dspark_l1_and_acceptance_are_the_same_from_dense_labels():
    from training.losses import _dspark_terms

    target, draft, seqs, mask, out, labels = _dense_labels_case("dspark")
    regen = _dspark_terms(
        draft, target, out.features, out.final_hidden, seqs, mask, torch.Generator().manual_seed(0), 6
    )
    distill = _dspark_terms(draft, target, out.features, labels, seqs, mask, torch.Generator().manual_seed(0), 6)
    assert torch.allclose(regen["l1"], distill["l1"], atol=1e-5)
    assert torch.allclose(regen["accept"], distill["accept"], atol=1e-5)


def test_eagle3_queries_give_the_rows_and_gradients_of_the_full_unroll():
    """The loss unrolls TTT only at the indices it trains: their logits, and the gradients of a loss on them, are
    those of unrolling every index (prompt indices still supply the step-0 keys)."""
    target = tiny_target()
    draft = tiny_draft(target, "eagle3")
    torch.manual_seed(0)
    F = torch.randn(2, 12, draft.cfg.feature_size)
    tokens = torch.randint(64, (2, 12))
    cols = torch.tensor([4, 5, 6, 9])
    full = draft.ttt_forward(F, tokens, 3)
    some = draft.ttt_forward(F, tokens, 3, queries=cols[None].expand(2, -1))
    for k in range(3):
        assert torch.allclose(full[k][:, cols], some[k], atol=1e-5)

    def grads(logits):
        draft.zero_grad()
        torch.stack([(step * (k + 1)).sum() for k, step in enumerate(logits)]).sum().backward()
        return [p.grad.clone() for p in draft.parameters() if p.grad is not None]

    a = grads([step[:, cols] for step in draft.ttt_forward(F, tokens, 3)])
    b = grads(draft.ttt_forward(F, tokens, 3, queries=cols[None].expand(2, -1)))
    assert len(a) == len(b) > 0 and all(torch.allclose(x, y, atol=1e-4) for x, y in zip(a, b))


def test_eagle3_loss_is_the_full_unrolls_loss():
    """The soft CE over the trained indices, written out on the full unroll, equals eagle3_loss."""
    from training.losses import EAGLE3_STEP_DECAY, eagle3_loss, target_probs

    target = tiny_target()
    draft = tiny_draft(target, "eagle3")
    seqs = torch.tensor(target_sequences(target, 2, 14))
    mask = torch.zeros_like(seqs)
    mask[:, 5:] = 1
    mask[1, 9:] = 0
    out = target.forward(
        seqs, torch.zeros(2, dtype=torch.long), feature_layers=(0, 1, 2), logits="none", return_final_hidden=True
    )
    assert out.final_hidden is not None
    loss, _ = eagle3_loss(draft, target, out.features, out.final_hidden, seqs, mask)
    p = target_probs(target, out.final_hidden, draft.d2t)
    T, expect = seqs.shape[1], torch.zeros(())
    for k, logits in enumerate(draft.ttt_forward(out.features, seqs, draft.cfg.block_size)):
        valid = eagle3_valid(mask, k)[:, : T - 1 - k]
        log_q = torch.log_softmax(logits[:, : T - 1 - k][valid], dim=-1)
        expect = expect + EAGLE3_STEP_DECAY**k * -(p[:, 1 + k :][valid] * log_q).sum(-1).mean()
    assert torch.allclose(loss, expect, atol=1e-5)
