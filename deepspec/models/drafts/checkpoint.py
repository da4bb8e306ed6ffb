"""Draft checkpoint directories: config.json + model.safetensors (+ vocab_map.safetensors) (+ eval.json).

Only trained weights are stored; the embedding and head are borrowed from the target at load time, which is why
config.json records the target fingerprint and loading against another target is refused with the mismatch
named. Weights may be stored in bf16 (`storage_dtype`) to halve the size; they are upcast on load.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from deepspec.models.drafts.config import DraftConfig
from deepspec.models.drafts.registry import build_draft

FORMAT_VERSION = 1
_META_KEYS = ("format_version", "storage_dtype")


class DraftCheckpointError(ValueError):
    """The directory is not a readable draft checkpoint (missing file, bad JSON, wrong tensors)."""


class DraftTargetMismatchError(ValueError):
    """The draft was trained against a different target than the one it is being loaded on."""


def save_draft(model, path: str | Path, storage_dtype: str = "float32", extra: dict | None = None) -> Path:
    """Write model (a DraftModel) to `path`; returns the directory."""
    from safetensors.torch import save_file

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[storage_dtype]
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous()
             for k, v in model.state_dict().items()}
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})
    if model.cfg.draft_vocab_size:
        save_file({"d2t": model.d2t.cpu().contiguous()}, path / "vocab_map.safetensors")
    config = {"format_version": FORMAT_VERSION, "storage_dtype": storage_dtype, **model.cfg.to_dict(), **(extra or {})}
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return path


def read_checkpoint_header(path: str | Path) -> dict:
    """config.json of any draft directory (neural or corpus lookup) as a dict with at least 'algo'."""
    path = Path(path)
    file = path / "config.json"
    if not file.is_file():
        raise DraftCheckpointError(f"{path} is not a draft checkpoint: config.json is missing")
    try:
        raw = json.loads(file.read_text())
    except ValueError as exc:
        raise DraftCheckpointError(f"{file} is not valid JSON ({exc}); re-export or re-train the draft") from None
    if not isinstance(raw, dict) or "algo" not in raw:
        raise DraftCheckpointError(f"{file} is not a draft config (no 'algo' key)")
    return raw


def read_draft_config(path: str | Path) -> DraftConfig:
    path = Path(path)
    file = path / "config.json"
    raw = read_checkpoint_header(path)
    version = raw.get("format_version", FORMAT_VERSION)
    if version > FORMAT_VERSION:
        raise DraftCheckpointError(f"{file} has format_version {version}; this DeepSpec reads <= {FORMAT_VERSION}")
    for key in _META_KEYS:
        raw.pop(key, None)
    try:
        return DraftConfig.from_dict(raw)
    except (TypeError, ValueError) as exc:
        raise DraftCheckpointError(f"{file}: {exc}") from None


def check_target(cfg: DraftConfig | dict, target, where: str = "draft") -> None:
    """Raise DraftTargetMismatchError naming every fingerprint field that differs (`cfg`: a DraftConfig or the
    fingerprint dict a corpus-lookup config.json holds)."""
    want, have = (cfg if isinstance(cfg, dict) else cfg.target), target.fingerprint()
    diffs = [f"{k}: draft was trained on {want.get(k)!r}, target has {have.get(k)!r}"
             for k in sorted(set(want) | set(have)) if want.get(k) != have.get(k)]
    if diffs:
        raise DraftTargetMismatchError(
            f"{where} does not match target '{target.name}': " + "; ".join(diffs)
            + ". Load it with the target it was trained on, or train a draft for this target.")


def load_draft(path: str | Path, target=None, *, device=None, dtype: torch.dtype | None = None):
    """Read a draft; with `target` check the fingerprint and attach the frozen embedding/head."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    cfg = read_draft_config(path)
    if target is not None:
        check_target(cfg, target, where=f"draft {path}")
    model = build_draft(cfg)
    weights = path / "model.safetensors"
    if not weights.is_file():
        raise DraftCheckpointError(f"{path}: model.safetensors is missing")
    try:
        state = load_file(weights)
        if cfg.draft_vocab_size:
            vocab_file = path / "vocab_map.safetensors"
            if not vocab_file.is_file():
                raise DraftCheckpointError(f"{path}: config says draft_vocab_size={cfg.draft_vocab_size} "
                                           "but vocab_map.safetensors is missing")
            model.set_vocab(load_file(vocab_file)["d2t"])
    except (SafetensorError, OSError, KeyError) as exc:
        raise DraftCheckpointError(f"{path}: cannot read the weights ({exc}); the file is corrupt or truncated") \
            from None
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    bad_shape = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    if missing or unexpected or bad_shape:
        raise DraftCheckpointError(f"{path}: weights do not fit the {cfg.algo} config (missing {missing[:5]}, "
                                   f"unexpected {unexpected[:5]}, wrong shape {bad_shape[:5]})")
    target_dtype = dtype or (target.dtype if target is not None else torch.float32)
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()})
    model = model.to(device=device or (target.device if target is not None else "cpu"), dtype=target_dtype)
    if target is not None:
        model.attach(target)
        model.prepack()
    return model.eval()
