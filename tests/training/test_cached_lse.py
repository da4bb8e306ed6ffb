"""The regen labels from the cached full-vocabulary log-sum-exp (`losses.FinalHidden`) are the full-head labels."""

from __future__ import annotations

import json

import torch

from tests.training.helpers import attached_draft_case, tiny_target
from training.losses import FinalHidden, eagle3_loss, full_vocab_lse, target_probs


def _case(algo: str = "eagle3"):
    target, draft, seqs, mask, out = attached_draft_case(algo, logits="none")
    assert out.final_hidden is not None
    final = FinalHidden(out.final_hidden, full_vocab_lse(target, out.final_hidden))
    return target, draft, seqs, mask, out, final


def _grads(draft, loss):
    draft.zero_grad()
    loss.backward()
    return [p.grad.clone() for p in draft.parameters() if p.grad is not None]


def test_draft_rows_and_the_lse_give_the_full_softmax_gathered_at_d2t():
    target, draft, _, _, out, final = _case()
    full = target_probs(target, final.hidden, draft.d2t)
    from_lse = target_probs(target, final, draft.d2t)
    assert torch.allclose(from_lse, full, atol=1e-6)
    assert float(from_lse.sum(-1).max()) < 1.0  # mass outside the draft vocabulary is not renormalised into it


def test_eagle3_loss_trains_the_same_from_the_cached_lse():
    target, draft, seqs, mask, out, final = _case()
    full, _ = eagle3_loss(draft, target, out.features, out.final_hidden, seqs, mask)
    cached, _ = eagle3_loss(draft, target, out.features, final, seqs, mask)
    assert torch.allclose(full, cached, atol=1e-5)
    a, b = _grads(draft, full), _grads(draft, cached)
    assert len(a) == len(b) > 0 and all(torch.allclose(x, y, atol=1e-5) for x, y in zip(a, b))


def test_dspark_terms_are_the_same_from_the_cached_lse():
    from training.losses import _dspark_terms

    target, draft, seqs, mask, out, final = _case("dspark")
    full = _dspark_terms(draft, target, out.features, out.final_hidden, seqs, mask, torch.Generator().manual_seed(0), 6)
    cached = _dspark_terms(draft, target, out.features, final, seqs, mask, torch.Generator().manual_seed(0), 6)
    assert torch.allclose(full["l1"], cached["l1"], atol=1e-5)


def test_target_distributions_stay_float32_under_cpu_autocast():
    """precision=bf16 autocasts the draft's matmuls on CPU; the labels it learns must not be rounded with them."""
    target, draft, _, _, out, final = _case()
    expect = target_probs(target, final.hidden, draft.d2t)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for labels in (final.hidden, final):
            got = target_probs(target, labels, draft.d2t)
            assert got.dtype == torch.float32 and torch.allclose(got, expect, atol=1e-6)


def test_offline_cache_stores_the_lse_and_completes_an_older_cache(tmp_path):
    from safetensors.torch import load_file, save_file

    from training.data import Sequence
    from training.features import OfflineFeatures

    target = tiny_target()
    seqs = [Sequence([1, 2, 3, 4, 5], [0, 1, 1, 1, 1]), Sequence([5, 6, 7], [0, 1, 1])]
    cache = OfflineFeatures(tmp_path, target, (0, 1))
    cache.build(seqs)
    features, final = cache([0, 1], torch.tensor([seqs[0].input_ids, seqs[1].input_ids[:3] + [0, 0]]))
    assert isinstance(final, FinalHidden) and final.lse.shape == (2, 5)
    assert torch.allclose(final.lse[0], full_vocab_lse(target, final.hidden[0]))
    # a cache written before the log-sum-exp existed: read as bare hidden states, completed by build()
    path = tmp_path / "0.safetensors"
    written = load_file(path)
    from safetensors import safe_open

    with safe_open(path, "pt") as f:
        metadata = f.metadata()
    save_file({k: v for k, v in written.items() if k != "final_lse"}, path, metadata=metadata)
    meta = json.loads((tmp_path / "meta.json").read_text())
    (tmp_path / "meta.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "final_lse"}))
    _, old = cache([0], torch.tensor([seqs[0].input_ids]))
    assert isinstance(old, torch.Tensor)  # the loss falls back to the whole head
    assert not cache.is_complete(seqs)
    cache.build(seqs)
    assert cache.is_complete(seqs)
    assert torch.equal(load_file(path)["final_lse"], written["final_lse"])
