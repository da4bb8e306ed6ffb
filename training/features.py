"""Where the target's hidden states come from during training.

- Online (default): the frozen target runs inside the loop on each batch — nothing on disk, any dataset size.
- Offline (`--cache-dir`): one pass writes only what the draft needs per token (the 5 feature layers and the
  final post-norm hidden state; target logits are recomputed from the latter by the frozen head), then every epoch
  and every algorithm with the same feature layers reads it back. `estimate_cache_bytes` is printed first.
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
        out = self.target.forward(tokens.to(self.target.device), torch.zeros(tokens.shape[0], dtype=torch.long,
                                  device=self.target.device), None, feature_layers=self.feature_layers,
                                  logits="none", return_final_hidden=True)
        return out.features, out.final_hidden


def estimate_cache_bytes(num_tokens: int, hidden_size: int, num_feature_layers: int, dtype: torch.dtype) -> int:
    return num_tokens * hidden_size * (num_feature_layers + 1) * torch.tensor([], dtype=dtype).element_size()


class OfflineFeatures:
    """Per-sequence safetensors files `<cache_dir>/<i>.safetensors` plus meta.json (layers, target fingerprint)."""

    def __init__(self, cache_dir: Path, target, feature_layers: tuple[int, ...]):
        self.dir, self.target, self.feature_layers = Path(cache_dir), target, tuple(feature_layers)

    def meta(self, sequences) -> dict:
        data = hashlib.sha1("".join(token_digest(s.input_ids) for s in sequences).encode()).hexdigest()[:16]
        return {"feature_layers": list(self.feature_layers), "target": self.target.fingerprint(),
                "num_sequences": len(sequences), "data": data}

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
        except Exception:  # noqa: BLE001 — a truncated or foreign file is simply recomputed
            return False

    @torch.no_grad()
    def build(self, sequences, on_sequence=None) -> None:
        """Run the target once over every sequence. Resumable: a file is kept only when it was computed from the
        same tokens (its digest), so editing the data or the draft's max_len never trains on stale features."""
        from safetensors.torch import save_file

        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "meta.json").unlink(missing_ok=True)
        online = OnlineFeatures(self.target, self.feature_layers)
        for i, seq in enumerate(sequences):
            path = self.dir / f"{i}.safetensors"
            digest = token_digest(seq.input_ids)
            if not self._is_current(path, digest):
                features, final = online([i], torch.tensor([seq.input_ids]))
                tmp = path.with_suffix(".tmp")
                save_file({"features": features[0].contiguous(), "final_hidden": final[0].contiguous()}, tmp,
                          metadata={"tokens": digest})
                tmp.rename(path)
            if on_sequence is not None:
                on_sequence(len(seq.input_ids))
        (self.dir / "meta.json").write_text(json.dumps(self.meta(sequences)))

    def __call__(self, indices: list[int], tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from safetensors.torch import load_file

        B, T = tokens.shape
        feats, finals = [], []
        for i in indices:
            d = load_file(self.dir / f"{i}.safetensors")
            pad = T - d["features"].shape[0]
            feats.append(torch.nn.functional.pad(d["features"], (0, 0, 0, pad)))
            finals.append(torch.nn.functional.pad(d["final_hidden"], (0, 0, 0, pad)))
        device = self.target.device
        return torch.stack(feats).to(device), torch.stack(finals).to(device)
