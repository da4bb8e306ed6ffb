"""Draft checkpoint directories: config.json + model.safetensors (+ vocab_map.safetensors) (+ eval.json).

Only trained weights are stored; the embedding and head are borrowed from the target at load time, which is why
config.json records the target fingerprint and loading against another target is refused with the mismatch
named. `storage_dtype` sets how the weights sit on disk — float32, bfloat16, int8 (per-row scales) or q4 (4-bit
blocks), deepspec/models/drafts/storage.py — and every one is cast to the compute dtype on load; the quantized
forms are what let the shipped drafts travel with the repository. Read the weights through `read_draft_weights`,
never model.safetensors directly, so every storage dtype comes back as float tensors.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from deepspec.algorithms import available_algorithms, load_part, resolve_algorithm
from deepspec.models.drafts.config import DraftConfig
from deepspec.models.drafts.storage import StoredWeightsError, restored_tensors, stored_tensors

FORMAT_VERSION = 1
_META_KEYS = ("format_version", "storage_dtype")


class DraftCheckpointError(ValueError):
    """The directory is not a readable draft checkpoint (missing file, bad JSON, wrong tensors)."""


class DraftTargetMismatchError(ValueError):
    """The draft was trained against a different target than the one it is being loaded on."""


def build_draft(cfg: DraftConfig):
    """A fresh (randomly initialised) draft of cfg.algo, its algorithm's module; call .attach(target) before use."""
    return load_part(resolve_algorithm(cfg.algo).module)(cfg)


def save_draft(model, path: str | Path, storage_dtype: str = "float32", extra: dict | None = None) -> Path:
    """Write model (a DraftModel) to `path` with its weights stored as `storage_dtype` (storage.STORAGE_DTYPES);
    returns
    the directory."""
    from safetensors.torch import save_file

    state = stored_tensors(model.state_dict(), storage_dtype)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})
    if model.cfg.draft_vocab_size:
        save_file({"d2t": model.d2t.cpu().contiguous()}, path / "vocab_map.safetensors")
    config = {"format_version": FORMAT_VERSION, "storage_dtype": storage_dtype, **model.cfg.to_dict(), **(extra or {})}
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return path


def convert_draft_storage(path: str | Path, storage_dtype: str) -> dict:
    """Rewrite a draft directory's model.safetensors in another storage dtype, in place; config.json keeps every
    other key and the other files are untouched. Returns {"storage_dtype", "bytes_before", "bytes_after"}."""
    from safetensors.torch import save_file

    path = Path(path)
    header = read_checkpoint_header(path)
    if header["algo"] not in available_algorithms():
        raise DraftCheckpointError(f"{path} is a {header['algo']} draft: it has no weights to re-store")
    read_draft_config(path)  # a config this DeepSpec can load, before anything is rewritten
    weights = path / "model.safetensors"
    bytes_before = weights.stat().st_size if weights.is_file() else 0
    state = stored_tensors(read_draft_weights(path), storage_dtype)
    tmp = weights.with_suffix(".tmp")
    save_file(state, tmp, metadata={"format": "pt"})
    tmp.replace(weights)
    header["storage_dtype"] = storage_dtype
    (path / "config.json").write_text(json.dumps(header, indent=2) + "\n")
    return {"storage_dtype": storage_dtype, "bytes_before": bytes_before, "bytes_after": weights.stat().st_size}


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


def read_draft_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """model.safetensors of a draft directory as its model's state dict: int8 and q4 matrices dequantized to
    float32, bf16 and float32 tensors as stored. DraftCheckpointError for a missing, corrupt or inconsistent file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    weights = path / "model.safetensors"
    if not weights.is_file():
        raise DraftCheckpointError(f"{path}: model.safetensors is missing")
    try:
        stored = load_file(weights)
    except (SafetensorError, OSError) as exc:
        raise DraftCheckpointError(
            f"{path}: cannot read the weights ({exc}); the file is corrupt or truncated"
        ) from None
    try:
        return restored_tensors(stored, str(weights))
    except StoredWeightsError as exc:
        raise DraftCheckpointError(str(exc)) from None


def check_target(cfg: DraftConfig | dict, target, where: str = "draft") -> None:
    """Raise DraftTargetMismatchError naming every fingerprint field that differs (`cfg`: a DraftConfig or the
    fingerprint dict a corpus-lookup config.json holds)."""
    want, have = (cfg if isinstance(cfg, dict) else cfg.target), target.fingerprint()
    diffs = [
        f"{k}: draft was trained on {want.get(k)!r}, target has {have.get(k)!r}"
        for k in sorted(set(want) | set(have))
        if want.get(k) != have.get(k)
    ]
    if diffs:
        raise DraftTargetMismatchError(
            f"{where} does not match target '{target.name}': "
            + "; ".join(diffs)
            + ". Load it with the target it was trained on, or train a draft for this target."
        )


def load_draft(path: str | Path, target=None, *, device=None, dtype: torch.dtype | None = None):
    """Read a draft; with `target` check the fingerprint and attach the frozen embedding/head."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    cfg = read_draft_config(path)
    if target is not None:
        check_target(cfg, target, where=f"draft {path}")
    model = build_draft(cfg)
    state = read_draft_weights(path)
    try:
        if cfg.draft_vocab_size:
            vocab_file = path / "vocab_map.safetensors"
            if not vocab_file.is_file():
                raise DraftCheckpointError(
                    f"{path}: config says draft_vocab_size={cfg.draft_vocab_size} but vocab_map.safetensors is missing"
                )
            model.set_vocab(load_file(vocab_file)["d2t"])
    except (SafetensorError, OSError, KeyError) as exc:
        raise DraftCheckpointError(
            f"{path}: cannot read the weights ({exc}); the file is corrupt or truncated"
        ) from None
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    bad_shape = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    if missing or unexpected or bad_shape:
        raise DraftCheckpointError(
            f"{path}: weights do not fit the {cfg.algo} config (missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}, wrong shape {bad_shape[:5]})"
        )
    target_dtype = dtype or (target.dtype if target is not None else torch.float32)
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()})
    model = model.to(device=device or (target.device if target is not None else "cpu"), dtype=target_dtype)
    if target is not None:
        model.attach(target)
        model.prepack()
    return model.eval()
