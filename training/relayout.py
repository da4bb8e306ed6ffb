"""A canonical-layout Eagle3 started from a trained deepspec-layout one, so the layout the engines load does not
have to be trained again from nothing.

The two layouts run the same layer (tests/deepspec/models/test_drafts.py checks it tensor for tensor): the
attention, MLP and norms carry over under their canonical names, and the deepspec layout's frozen target head over
the draft vocabulary is exactly where a fresh canonical lm_head starts. Only `fc` differs in shape: it reads the
engines' 3 captured layers instead of our 5. It is refit by least squares so that fc_new(F3) reproduces
fc_old(F5) on the target's hidden states over training rows — one target forward per row and a (3H × 3H) solve,
minutes on a CPU where training the draft again took the better part of an hour. The fit's R² says how much of
fc_old's output the 3 layers explain; training the result (`init_from`) takes it the rest of the way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: deepspec-layout module → canonical-layout module of the same tensor (fc is refit, not copied)
CANONICAL_NAMES = {
    "embed_norm": "midlayer.input_layernorm",
    "hidden_norm": "midlayer.hidden_norm",
    "attn": "midlayer.self_attn",
    "mlp_norm": "midlayer.post_attention_layernorm",
    "mlp": "midlayer.mlp",
    "final_norm": "norm",
}


@dataclass
class FcFit:
    """How well fc_new(F3) reproduces fc_old(F5) on the fitting tokens."""

    num_tokens: int
    #: 1 - residual / variance of fc_old's output (1.0 = the 3 layers reproduce it exactly)
    r_squared: float


def canonical_config(source, target):
    """The canonical DraftConfig with the source draft's sizes and vocabulary, the engines' 3 layers."""
    from deepspec.models.drafts import DraftConfig

    cfg = source.cfg
    if cfg.algo != "eagle3" or cfg.layout != "deepspec":
        raise ValueError(
            f"relayout starts from a deepspec-layout eagle3 draft; this one is {cfg.algo} ({cfg.layout} layout)"
        )
    if cfg.num_layers != 1:
        raise ValueError(f"the canonical layout has one layer; the source draft has {cfg.num_layers}")
    return DraftConfig.for_target(
        target,
        "eagle3",
        layout="canonical",
        block_size=cfg.block_size,
        draft_vocab_size=cfg.draft_vocab_size,
        confidence_threshold=cfg.confidence_threshold,
    )


@torch.no_grad()
def fit_fc(
    source_fc: torch.Tensor,
    source_layers: tuple[int, ...],
    new_layers: tuple[int, ...],
    target,
    token_rows: list[list[int]],
    ridge: float = 1e-8,
) -> tuple[torch.Tensor, FcFit]:
    """W_new [H, len(new_layers)·H] minimizing Σ_t ||W_new F_new[t] - W_old F_old[t]||² (+ ridge · mean diag of
    FᵀF · ||W_new||², which only matters for collinear features) over every token of `token_rows`, the
    features taken from the target's own forward."""
    if not token_rows:
        raise ValueError("fit_fc needs at least one row of tokens")
    layers = tuple(sorted(set(source_layers) | set(new_layers)))
    H = source_fc.shape[0]
    w_old = source_fc.double()
    gram, cross, num_tokens = None, None, 0
    sum_y, sum_y2 = torch.zeros(H, dtype=torch.float64), 0.0
    for row in token_rows:
        tokens = torch.tensor([row], device=target.device)
        out = target.forward(
            tokens, torch.zeros(1, dtype=torch.long, device=target.device), None, feature_layers=layers, logits="none"
        )
        per_layer = dict(zip(layers, out.features[0].double().cpu().split(H, dim=-1)))  # layer → [T, H]
        f_old = torch.cat([per_layer[i] for i in source_layers], dim=-1)
        f_new = torch.cat([per_layer[i] for i in new_layers], dim=-1)
        y = f_old @ w_old.T  # [T, H]: what the source draft's fc feeds its layer
        gram = f_new.T @ f_new if gram is None else gram + f_new.T @ f_new
        cross = f_new.T @ y if cross is None else cross + f_new.T @ y
        sum_y += y.sum(0)
        sum_y2 += float((y * y).sum())
        num_tokens += len(row)
    if gram is None or cross is None:
        raise ValueError("no feature rows to fit the new fc layout on: give relayout some training rows")
    reg = ridge * gram.diagonal().mean() * torch.eye(gram.shape[0], dtype=gram.dtype)
    w_new_t = torch.linalg.solve(gram + reg, cross)  # [3H, H]
    # residual Σ||y - F w||² = Σ||y||² - 2 tr(wᵀ FᵀY) + tr(wᵀ FᵀF w), from the accumulated moments
    residual = sum_y2 - 2 * float((w_new_t * cross).sum()) + float((w_new_t * (gram @ w_new_t)).sum())
    variance = sum_y2 - float((sum_y * sum_y).sum()) / num_tokens
    fit = FcFit(num_tokens=num_tokens, r_squared=round(1.0 - residual / max(variance, 1e-30), 4))
    return w_new_t.T.float().contiguous(), fit


def canonical_from_deepspec(source, target, token_rows: list[list[int]]) -> tuple[object, FcFit]:
    """(canonical Eagle3 draft, fc fit): the source's layer and vocabulary, lm_head = the target's rows, fc refit."""
    from deepspec.models.drafts import build_draft

    cfg = canonical_config(source, target)
    draft = build_draft(cfg)
    draft.set_vocab(source.d2t.cpu())
    draft.attach(target).init_from_target()
    fc, fit = fit_fc(
        source.fc.weight.detach().cpu(), tuple(source.cfg.feature_layers), tuple(cfg.feature_layers), target, token_rows
    )
    state = {"fc.weight": fc}
    for name, tensor in source.state_dict().items():
        module = name.split(".")[0]
        if module in CANONICAL_NAMES:
            state[CANONICAL_NAMES[module] + name[len(module) :]] = tensor.detach().float().cpu()
    missing = set(draft.state_dict()) - set(state) - {"lm_head.weight", "d2t", "t2d"}
    if missing:
        raise ValueError(f"the source draft has no tensors for {sorted(missing)}")
    draft.load_state_dict({**draft.state_dict(), **state})
    return draft, fit
