"""Where the target's hidden states come from during training.

- Online (default): the frozen target runs inside the loop on each batch — nothing on disk, any dataset size.
- Offline (`--cache-dir`): one pass writes only what the draft needs per token (the feature layers, the final
  post-norm hidden state and the log-sum-exp of the target's full-vocabulary logits, 4 bytes: the loss then
  recomputes the target's probabilities from the head's draft-vocabulary rows alone, `losses.FinalHidden`), then
  every epoch and every algorithm with the same feature layers reads it back. `estimate_cache_bytes` is printed
  first. A cache written before the log-sum-exp existed gets it added from its stored hidden states (no target
  forward).
  Under `--labels target` the final hidden state is replaced by the top-k soft labels (training/distill.py).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch


def token_digest(input_ids: list[int]) -> str:
    """What a cached file was computed from: a file whose digest differs from its sequence's is stale."""
    return hashlib.sha1(json.dumps(input_ids).encode()).hexdigest()[:16]


class OnlineFeatures:
    def __init__(self, target, feature_layers: tuple[int, ...]):
        self.target, self.feature_layers = target, tuple(feature_layers)

    @torch.no_grad()
    def __call__(self, indices: list[int], tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [B, T] → features [B, T, 5H], final_hidden [B, T, H] (whole-context causal forward)."""
        out = self.target.forward(
            tokens.to(self.target.device),
            torch.zeros(tokens.shape[0], dtype=torch.long, device=self.target.device),
            None,
            feature_layers=self.feature_layers,
            logits="none",
            return_final_hidden=True,
        )
        return out.features, out.final_hidden


def estimate_cache_bytes(
    num_tokens: int, hidden_size: int, num_feature_layers: int, dtype: torch.dtype, label_top_k: int | None = None
) -> int:
    """Cache size: the features plus the final hidden state, or with `label_top_k` (labels=target) the top-k
    labels (float32 probability + int32 id per kept token)."""
    element = torch.tensor([], dtype=dtype).element_size()
    if label_top_k is None:
        return num_tokens * hidden_size * (num_feature_layers + 1) * element
    return num_tokens * (hidden_size * num_feature_layers * element + label_top_k * 8)


class OfflineFeatures:
    """Per-sequence safetensors files `<cache_dir>/<i>.safetensors` plus meta.json (layers, target fingerprint,
    what wrote them, and for soft labels their top k and vocabulary map).

    `writer`: another target that computes the files instead of the training target: the native CPU decoder on the
    target's served weights writes features and final hidden states several times faster than the PyTorch target,
    and a draft trained on them learns the features the native backend serves it (the same model's, rounded by its
    4-bit or int8 weights). Files of one writer are never read as the other's."""

    def __init__(self, cache_dir: Path, target, feature_layers: tuple[int, ...], distill=None, writer=None):
        self.dir, self.target, self.feature_layers = Path(cache_dir), target, tuple(feature_layers)
        #: a training.distill.DistillFeatures: cache its soft labels instead of the final hidden state
        self.distill = distill
        if writer is not None and distill is not None:
            raise ValueError("a cache writer other than the training target writes no soft labels")
        self.writer = writer

    def meta(self, sequences) -> dict:
        data = hashlib.sha1("".join(token_digest(s.input_ids) for s in sequences).encode()).hexdigest()[:16]
        meta = {
            "feature_layers": list(self.feature_layers),
            "target": self.target.fingerprint(),
            "num_sequences": len(sequences),
            "data": data,
            "writer": self._writer_name(),
        }
        if self.distill is None:
            meta["final_lse"] = True  # files without it are completed by build()
        if self.distill is not None:
            meta["labels"] = self.meta_labels()
        return meta

    def _writer_name(self) -> str:
        """ "target", or the other writer's kind and weights (e.g. "NativeTarget/q4")."""
        if self.writer is None:
            return "target"
        return f"{type(self.writer).__name__}/{getattr(self.writer, 'quantization', '')}"

    def _kind(self) -> str:
        """Tag of what a file holds beside the features (and who wrote it), so a file of another kind is
        recomputed."""
        labels = self.meta_labels()
        written = "" if self.writer is None else f"/writer:{self._writer_name()}"
        return written + ("" if labels is None else f"/labels:{labels['top_k']}:{labels['d2t']}")

    def meta_labels(self) -> dict | None:
        if self.distill is None:
            return None
        return {"top_k": self.distill.top_k, "d2t": token_digest(self.distill.d2t.tolist())}

    def _tensors(self, index: int, input_ids: list[int]) -> dict[str, torch.Tensor]:
        """What one sequence's file holds."""
        if self.distill is None:
            writer = self.writer if self.writer is not None else self.target
            features, final = OnlineFeatures(writer, self.feature_layers)([index], torch.tensor([input_ids]))
            dtype = self.target.dtype  # what the training target's own features would be, whoever wrote them
            final = final[0].to(dtype).contiguous()
            return {"features": features[0].to(dtype).contiguous(), "final_hidden": final, **self._lse(final)}
        features, labels = self.distill([index], torch.tensor([input_ids]))
        return {
            "features": features[0].contiguous(),
            "label_probs": labels.probs[0].contiguous(),
            "label_ids": labels.ids[0].to(torch.int32).contiguous(),
        }  # int32: N < 2^31, half the bytes

    def _lse(self, final_hidden: torch.Tensor) -> dict[str, torch.Tensor]:
        """The file entry of the full-vocabulary log-sum-exp of a final hidden state [T, H] → {"final_lse": [T]}."""
        from training.losses import full_vocab_lse

        return {"final_lse": full_vocab_lse(self.target, final_hidden).contiguous()}

    def _add_lse(self, path: Path) -> None:
        """Give a regen file written without the log-sum-exp its entry, from its own final hidden states."""
        from safetensors import safe_open
        from safetensors.torch import load_file, save_file

        with safe_open(path, "pt") as f:
            names = set(f.keys())
            if "final_lse" in names or "final_hidden" not in names:
                return
            metadata = f.metadata()
        tensors = load_file(path)
        tmp = path.with_suffix(".tmp")
        save_file({**tensors, **self._lse(tensors["final_hidden"])}, tmp, metadata=metadata)
        tmp.rename(path)

    def is_complete(self, sequences) -> bool:
        meta = self.dir / "meta.json"
        return meta.is_file() and json.loads(meta.read_text()) == self.meta(sequences)

    def _is_current(self, path: Path, digest: str) -> bool:
        from safetensors import safe_open

        if not path.is_file():
            return False
        try:
            with safe_open(path, "pt") as f:
                return (f.metadata() or {}).get("tokens") == digest
        except Exception:
            return False

    @torch.no_grad()
    def build(self, sequences, on_sequence=None) -> None:
        """Run the target once over every sequence. Resumable: a file is kept only when it was computed from the
        same tokens (its digest), so editing the data or the draft's max_len never trains on stale features."""
        from safetensors.torch import save_file

        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "meta.json").unlink(missing_ok=True)
        for i, seq in enumerate(sequences):
            path = self.dir / f"{i}.safetensors"
            digest = token_digest(seq.input_ids) + self._kind()
            if not self._is_current(path, digest):
                tmp = path.with_suffix(".tmp")
                save_file(self._tensors(i, seq.input_ids), tmp, metadata={"tokens": digest})
                tmp.rename(path)
            elif self.distill is None:
                self._add_lse(path)
            if on_sequence is not None:
                on_sequence(len(seq.input_ids))
        (self.dir / "meta.json").write_text(json.dumps(self.meta(sequences)))

    def __call__(self, indices: list[int], tokens: torch.Tensor):
        """tokens [B, T] → features [B, T, nH] and FinalHidden ([B, T, H] + [B, T]; a bare final_hidden tensor
        from a file without the log-sum-exp) or SoftLabels [B, T, k], right-padded."""
        from safetensors.torch import load_file

        from training.distill import SoftLabels
        from training.losses import FinalHidden

        B, T = tokens.shape
        rows = [load_file(self.dir / f"{i}.safetensors") for i in indices]

        def stacked(key: str) -> torch.Tensor:
            def padded(x: torch.Tensor) -> torch.Tensor:  # the time axis (the first) to T
                return torch.nn.functional.pad(x, (0, 0) * (x.dim() - 1) + (0, T - x.shape[0]))

            return torch.stack([padded(d[key]) for d in rows])

        device = self.target.device
        if self.distill is None:
            final = stacked("final_hidden")
            if all("final_lse" in d for d in rows):
                return stacked("features").to(device), FinalHidden(final, stacked("final_lse")).to(device)
            return stacked("features").to(device), final.to(device)
        labels = SoftLabels(stacked("label_probs"), stacked("label_ids").long())
        return stacked("features").to(device), labels.to(device)
