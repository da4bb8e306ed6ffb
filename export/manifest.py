"""manifest.json: what an output directory holds and what it was made from.

Common fields (every format): `format`, `engine`, `target` (the alias or path given) with `target_fingerprint`,
`draft` (a path relative to the directory, or a worker keyword) with `draft_source` and `algorithm`, `dtype`,
`captured_layers_hs` (hs indices, see export/layer_ids.py), `tools` (versions), `files` (every file but the manifest:
relative path -> sha256 and bytes). Formats add their own fields (launch commands, engine layer ids, tp).
The worker (`service/worker/bundle.py`) reads `format`, `target`, `draft` and `dtype`.
"""

from __future__ import annotations

import hashlib
import json
import platform
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
_TOOLS = ("deepspec", "torch", "transformers", "safetensors", "speculators", "onnx", "onnxruntime")


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def tool_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in _TOOLS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def file_table(root: Path, advance=lambda n: None) -> dict[str, dict]:
    table = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST):
        table[path.relative_to(root).as_posix()] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
        advance(1)
    return table


def write_manifest(root: Path, fields: dict, advance=lambda n: None) -> dict:
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        **fields,
        "tools": tool_versions(),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "files": file_table(root, advance),
    }
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def verify_files(root: Path) -> list[str]:
    """Files whose sha256 no longer matches the manifest (or that are missing): empty when the directory is intact."""
    manifest = json.loads((root / MANIFEST).read_text())
    bad = []
    for rel, entry in manifest["files"].items():
        path = root / rel
        if not path.is_file() or sha256_file(path) != entry["sha256"]:
            bad.append(rel)
    return bad
