"""training/relayout.py: a canonical-layout Eagle3 from a trained deepspec-layout one (layer copied, fc refit)."""

from __future__ import annotations

import pytest
import torch

from deepspec.models.drafts.layers import DraftModel
from tests.training.helpers import target_sequences, tiny_draft, tiny_target
from training.relayout import canonical_from_deepspec

CANONICAL_LAYERS = (1, 3, 4)  # canonical_feature_layers(8): {1, L//2 - 1, L - 4}


@pytest.fixture(scope="module")
def target():
    return tiny_target(layers=8)


def _ttt_logits(draft, target, tokens):
    out = target.forward(
        tokens, torch.zeros(1, dtype=torch.long), None, feature_layers=draft.cfg.feature_layers, logits="none"
    )
    return torch.stack(draft.ttt_forward(out.features, tokens, 3))


def test_a_source_reading_only_the_engines_layers_is_reproduced_exactly(target):
    """When the source's fc reads nothing but the 3 canonical layers, least squares recovers that fc (R² = 1) and
    the canonical draft computes the source's logits on the target's own features: the layer, norms, vocabulary
    and head carried over unchanged."""
    source = tiny_draft(target, "eagle3", feature_layers=(1, 2, 3, 4, 5), draft_vocab_size=24).eval()
    source.set_vocab(torch.arange(0, 48, 2))
    H = target.spec.hidden_size
    with torch.no_grad():
        for block, layer in enumerate(source.cfg.feature_layers):
            if layer not in CANONICAL_LAYERS:
                source.fc.weight[:, block * H : (block + 1) * H] = 0
    rows = target_sequences(target, num=12, length=40)
    canon, fit = canonical_from_deepspec(source, target, rows)
    assert isinstance(canon, DraftModel)
    assert canon.cfg.layout == "canonical" and canon.cfg.feature_layers == CANONICAL_LAYERS
    assert fit.num_tokens == 12 * 40 and fit.r_squared > 0.9999
    assert torch.equal(canon.d2t, source.d2t)
    tokens = torch.tensor([target_sequences(target, num=1, length=24, seed=5)[0]])
    with torch.no_grad():
        want, got = _ttt_logits(source, target, tokens), _ttt_logits(canon.eval(), target, tokens)
    assert torch.allclose(got, want, atol=1e-3, rtol=1e-3)


def test_a_source_reading_other_layers_gets_the_best_linear_fit(target):
    """With the source's fc on layers the canonical draft does not see, the refit explains part of fc_old's output
    (0 < R² < 1) and no other fc does better: perturbing the solution only raises the squared error."""
    from training.relayout import fit_fc

    source = tiny_draft(target, "eagle3", feature_layers=(0, 2, 5, 6, 7))
    rows = target_sequences(target, num=8, length=32)
    w_new, fit = fit_fc(source.fc.weight.detach(), (0, 2, 5, 6, 7), CANONICAL_LAYERS, target, rows, ridge=0.0)
    assert 0.0 < fit.r_squared < 0.9999

    def squared_error(w):
        total = 0.0
        for row in rows:
            tokens = torch.tensor([row])
            start = torch.zeros(1, dtype=torch.long)
            f_old = target.forward(tokens, start, None, feature_layers=(0, 2, 5, 6, 7), logits="none").features[0]
            f_new = target.forward(tokens, start, None, feature_layers=CANONICAL_LAYERS, logits="none").features[0]
            total += float(((f_new.double() @ w.double().T - f_old.double() @ source.fc.weight.double().T) ** 2).sum())
        return total

    best = squared_error(w_new)
    torch.manual_seed(3)
    assert all(squared_error(w_new + 1e-2 * torch.randn_like(w_new)) > best for _ in range(3))


def test_only_a_one_layer_deepspec_eagle3_is_a_source(target):
    rows = [[1, 2, 3]]
    with pytest.raises(ValueError, match="deepspec-layout eagle3 draft; this one is dflash"):
        canonical_from_deepspec(tiny_draft(target, "dflash"), target, rows)
    with pytest.raises(ValueError, match="canonical layout has one layer; the source draft has 2"):
        canonical_from_deepspec(tiny_draft(target, "eagle3", num_layers=2), target, rows)
    with pytest.raises(ValueError, match="at least one row"):
        canonical_from_deepspec(tiny_draft(target, "eagle3"), target, [])
