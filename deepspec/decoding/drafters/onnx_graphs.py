"""Neural drafters whose forward passes run as ONNX Runtime graphs (`python -m export --format onnx` writes them).

The drafters themselves are the PyTorch ones (Eagle3Drafter, DFlashDrafter, DSparkDrafter): chains, trees, DSpark's
Markov walk, the per-slot caches and `move_slot` stay exactly theirs. What changes is the model they call:
`OnnxDraftModel` answers the model methods a drafter uses (`fc`, `cached_step`, `logits` for Eagle3; `context`,
`context_kv`, `block_input`, `blocks`, `head`, `step_logits` for DFlash/DSpark) by running the graphs of
export/onnx/draft_graph.py, and hands everything else (config, vocabulary maps, `calibrated`, `scatter_probs`) to
the PyTorch module it was loaded with, whose weights are then never multiplied.

Two calls are fused in the graphs and so in this stand-in: DFlash's `context(F)` returns F unchanged and
`context_kv` runs fc + norm + the per-layer k/v in one graph; `block_input(anchors)` returns the anchors and
`blocks` embeds them inside the block graph, whose logits `head` then returns for that same hidden tensor.

Which graph files a draft has is its algorithm's record (deepspec/algorithms: `onnx.files`). The drafter registry
(deepspec/decoding/registry.py) loads every draft algorithm's directories through `checkpoint_loader` below, so
`build_drafter` picks the graphs by itself when the target is the ONNX export that was written with that very draft,
and the PyTorch forward for any other draft or target:

    target = load_target(str(export_dir))                       # an OnnxTarget
    drafter = build_drafter(str(export_dir / "draft"), target)  # drafter.model is an OnnxDraftModel
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from deepspec.algorithms import resolve_algorithm
from deepspec.decoding.drafters.neural import NeuralDrafter
from deepspec.models.drafts.layers import DraftModel
from deepspec.models.target import Target


def _np(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.detach().cpu().numpy())


class OnnxDraftModel:
    """Stands in for a PyTorch draft module inside its drafter; the compute runs in ONNX Runtime sessions."""

    def __init__(self, model: DraftModel, graph_dir: Path, num_threads: int | None = None):
        import onnxruntime as ort

        from deepspec.models.onnx_target import session_options, spinning_mode

        self._model = model.float().eval()
        self.cfg = model.cfg
        graphs = resolve_algorithm(self.cfg.algo).onnx
        if graphs is None:
            raise ValueError(f"no ONNX graphs for {self.cfg.algo} drafts")
        names = graphs.files
        missing = [n for n in names if not (Path(graph_dir) / n).is_file()]
        if missing:
            raise FileNotFoundError(
                f"{graph_dir}: missing {', '.join(missing)} (export again with python -m export --format onnx)"
            )
        options = session_options(num_threads or torch.get_num_threads(), spinning_mode())
        self.sessions = {
            Path(n).stem: ort.InferenceSession(
                str(Path(graph_dir) / n), sess_options=options, providers=["CPUExecutionProvider"]
            )
            for n in names
        }
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None  # (hidden, logits) of the last block run

    def __getattr__(self, name: str):  # config, vocabulary maps, calibrated, scatter_probs, parameters, ...
        model = self.__dict__.get("_model")
        if model is None:
            raise AttributeError(name)
        return getattr(model, name)

    def _run(self, graph: str, feeds: dict[str, np.ndarray]) -> list[torch.Tensor]:
        return [torch.from_numpy(o) for o in self.sessions[graph].run(None, feeds)]

    # ---- Eagle3 ------------------------------------------------------------------------------------------------
    def fc(self, features: torch.Tensor) -> torch.Tensor:
        """features [B, T, F] → fc(F) [B, T, H]."""
        return self._run("eagle3_fc", {"features": _np(features.float())})[0]

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Pre-norm hidden [.., H] → logits [.., N]."""
        flat = h.float().reshape(1, -1, h.shape[-1])
        return self._run("eagle3_head", {"hidden": _np(flat)})[0].reshape(*h.shape[:-1], -1)

    def cached_step(self, h, tokens, positions, cache_k, cache_v, rows, cache_index=None, visible=None):
        """Eagle3Draft.cached_step: the graph attends over the rows' first K entries with the new pairs written in;
        the new entries are written into the drafter's cache here."""
        where = positions if cache_index is None else cache_index
        if visible is None:
            num_keys = int(positions.max()) + 1
            visible = torch.arange(num_keys)[None, None, :] <= positions[:, :, None]
        num_keys = visible.shape[-1]
        out, k, v = self._run(
            "eagle3_step",
            {
                "hidden": _np(h.float()),
                "input_ids": _np(tokens.long()),
                "positions": _np(positions.long()),
                "cache_key": _np(cache_k[rows, :, :num_keys]),
                "cache_value": _np(cache_v[rows, :, :num_keys]),
                "write_index": _np(where.long()),
                "visible": _np(visible.bool()),
            },
        )
        heads = torch.arange(self.cfg.num_kv_heads)[None, :, None]
        index = (rows[:, None, None], heads, where[:, None, :])
        cache_k.index_put_(index, k.to(cache_k.dtype))
        cache_v.index_put_(index, v.to(cache_v.dtype))
        return out

    # ---- DFlash / DSpark ---------------------------------------------------------------------------------------
    def context(self, features: torch.Tensor) -> torch.Tensor:
        """Fused into `context_kv` (one graph): the features pass through."""
        return features

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """features [B, T, F] at positions [B, T] → per draft layer (k, v) [B, nkv, T, hd]."""
        outs = self._run("dflash_context", {"features": _np(features.float()), "positions": _np(positions.long())})
        return [(outs[2 * i], outs[2 * i + 1]) for i in range(self.cfg.num_layers)]

    def block_input(self, anchors: torch.Tensor) -> torch.Tensor:
        """Fused into `blocks` (the block graph embeds its anchor): anchors [B, 1] pass through."""
        if anchors.shape[1] != 1:
            raise ValueError("the ONNX block graph drafts one block per row")
        return anchors

    def blocks(self, anchors, block_pos, ctx_kv, mask) -> torch.Tensor:
        """anchors [B, 1], block_pos [B, γ], ctx_kv per layer [B, nkv, K, hd], mask [B, 1, γ, K+γ] → hidden [B, γ, H]
        (post-norm); the block's logits are kept for `head`."""
        feeds = {"anchor": _np(anchors[:, 0].long()), "positions": _np(block_pos.long()), "visible": _np(mask[:, 0])}
        for i, (k, v) in enumerate(ctx_kv):
            feeds[f"context_key.{i}"], feeds[f"context_value.{i}"] = _np(k.float()), _np(v.float())
        hidden, logits = self._run("dflash_block", feeds)
        self._last = (hidden, logits)
        return hidden

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The logits the block graph computed with `hidden`."""
        if self._last is None or hidden is not self._last[0]:
            raise RuntimeError("the ONNX draft's head returns the block graph's logits: call blocks() first")
        return self._last[1]

    def step_logits(self, hidden: torch.Tensor, base_logits: torch.Tensor, prev_tokens: torch.Tensor):
        """DSparkDraft.step_logits through dspark_markov: (logits [.., N], confidence logit [..])."""
        lead = prev_tokens.shape
        feeds = {
            "hidden": _np(hidden.float().reshape(1, -1, hidden.shape[-1])),
            "base_logits": _np(base_logits.float().reshape(1, -1, base_logits.shape[-1])),
            "prev_tokens": _np(prev_tokens.long().reshape(1, -1)),
        }
        logits, conf = self._run("dspark_markov", feeds)
        return logits.reshape(*lead, -1), conf.reshape(lead)


def draft_graph_dir(draft_dir: str | Path, target: Target) -> Path | None:
    """Where the ONNX graphs of `draft_dir` are, when `target` is an ONNX export that wrote them for this draft."""
    from deepspec.models.onnx_target import OnnxTarget

    return target.exported_draft_graphs(draft_dir) if isinstance(target, OnnxTarget) else None


def checkpoint_loader(cls: type[NeuralDrafter], pytorch_loader: Callable[..., NeuralDrafter]):
    """The registry's loader for a draft algorithm's directories (`cls` its drafter class): through the graphs the
    ONNX export wrote for this very draft when `target` is that export (the draft's weights are read only for what
    the graphs do not hold), else `pytorch_loader` (another draft on an ONNX target, any draft on a PyTorch target,
    or an algorithm without graphs)."""

    def load(path: Path, header: dict, target: Target, **options) -> NeuralDrafter:
        graphs = draft_graph_dir(path, target)
        if graphs is None:
            return pytorch_loader(path, header, target, **options)
        from deepspec.models.drafts import load_draft

        return cls(OnnxDraftModel(load_draft(path, target, dtype=torch.float32), graphs), **options)

    return load
