"""What the machine has: the modules each part imports, the versions the report records, and the wheels
`make gpu-wheels` downloaded for what it lacks.

The GPU machine runs its own Python stack with no network, so nothing here installs from an index: wheels in
`.whl/` (py3.12 manylinux wheels of exactly the packages the machine lacks, carried with the checkout) go into a
directory of their own with `pip install --no-index --no-deps --target`, and that directory is put first on
sys.path. A wheel is installed only when its distribution is absent or older than the wheel, so the machine's own
packages are never replaced by ours. Call `install_wheels` before importing anything else.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

#: modules each part imports (beyond the standard library), checked before it runs
PART_MODULES = {
    "setup": ("torch", "transformers", "tokenizers", "safetensors", "numpy", "yaml"),
    "kernels": ("torch", "triton"),
    "engine": ("torch", "transformers", "numpy"),
    "training": ("torch", "pydantic", "yaml"),
    "onnx": ("onnx", "onnxruntime", "numpy"),
    # tensorrt and vllm themselves are checked by their rows, which say `skipped` without them: the rows that need
    # only triton (the AOT contract) or our export still run
    "tensorrt": ("torch", "triton"),
    "vllm": ("torch", "transformers", "safetensors"),
}
#: distributions whose versions the report records
VERSIONED = (
    "torch",
    "triton",
    "transformers",
    "tokenizers",
    "onnx",
    "onnxruntime",
    "numpy",
    "pydantic",
    "tensorrt",
    "vllm",
)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", version.split("+")[0])[:4])


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def wheels_to_install(wheel_dir: Path) -> list[Path]:
    """The wheels in `wheel_dir` whose distribution is missing here or older than the wheel."""
    chosen = []
    for wheel in sorted(wheel_dir.glob("*.whl")):
        name, version = wheel.name.split("-")[:2]
        have = installed_version(_normalized(name)) or installed_version(name)
        if have is None or _version_key(have) < _version_key(version):
            chosen.append(wheel)
    return chosen


def install_wheels(wheel_dir: Path, site_dir: Path, log=print) -> list[str]:
    """Install what `wheels_to_install` picks into `site_dir` (offline, without dependencies) and put `site_dir`
    first on sys.path and PYTHONPATH (for the parts' subprocesses); returns the wheel names installed."""
    if not wheel_dir.is_dir():
        return []
    chosen = wheels_to_install(wheel_dir)
    if chosen:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-index",
                "--no-deps",
                "--upgrade",
                "--target",
                str(site_dir),
                *map(str, chosen),
            ],
            check=True,
        )
        log(f"installed {', '.join(w.name for w in chosen)} into {site_dir}")
    if site_dir.is_dir():
        sys.path.insert(0, str(site_dir))
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site_dir), os.environ.get("PYTHONPATH")]))
        importlib.invalidate_caches()
    return [w.name for w in chosen]


def missing_modules(modules: tuple[str, ...]) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


def describe() -> dict:
    """Python, platform, the recorded versions, and the GPU (name, capability, memory) when there is one."""
    info = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": {d: installed_version(d) for d in VERSIONED},
    }
    try:
        import torch

        info["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info["gpu"] = {
                "name": props.name,
                "capability": f"{props.major}.{props.minor}",
                "memory_gib": round(props.total_memory / 2**30, 1),
            }
    except ImportError:
        pass
    try:
        import onnxruntime

        info["onnxruntime_providers"] = onnxruntime.get_available_providers()
    except ImportError:
        pass
    return info
