"""The GPU worker image's pip constraints: every package the image's TensorRT-LLM requires, pinned at the version
the image installed, so installing DeepSpec into /opt/venv (which sees the image's packages through
--system-site-packages) replaces none of them.

    python3 docker/trtllm_constraints.py requirements.txt > constraints.txt   # in the base image's interpreter
    python3 docker/trtllm_constraints.py --verify /opt/venv/bin/python        # after the install: nothing replaced

A requirement of ours that the pinned version cannot satisfy (transformers >= 5 against TensorRT-LLM 1.2.1's 4.x,
xgrammar >= 0.2.9 against its 0.1.x) is not constrained: it is an override, listed on stderr, installed into the venv
only. The venv is DeepSpec's worker and export; everything that imports tensorrt_llm (build.sh, trtllm-build,
tritonserver's Python backend) runs on the image's own interpreter, `TRTLLM_PYTHON`, which never sees the venv.
`--verify` checks the result: the venv resolves every pinned package that is not an override to the image's version
(pip installs into the venv only, so the image's interpreter keeps all of them).

Standard library only, plus `packaging` (which pip vendors and the base image ships).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from importlib import metadata

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # an interpreter without packaging: pip's vendored copy is the same code
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

#: the distribution whose pins are kept
PINNED_BY = "tensorrt_llm"


def pinned_requirements(dist: str = PINNED_BY, versions=None, requires=None) -> dict[str, str]:
    """name -> installed version of each requirement of `dist` that applies here (markers, no extras)."""
    versions = versions or (lambda name: metadata.version(name))
    requires = requires if requires is not None else (metadata.requires(dist) or [])
    pins = {}
    for line in requires:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            pins[canonicalize_name(req.name)] = versions(req.name)
        except metadata.PackageNotFoundError:
            continue  # an optional dependency the image did not install: nothing to keep
    return pins


def split(ours: list[str], pins: dict[str, str]) -> tuple[list[str], list[str]]:
    """(constraint lines `name==version`, overrides: our requirement lines the pinned version does not satisfy)."""
    overrides, clashing = [], set()
    for line in ours:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        if name in pins and not req.specifier.contains(pins[name], prereleases=True):
            overrides.append(line)
            clashing.add(name)
    return [f"{name}=={version}" for name, version in sorted(pins.items()) if name not in clashing], overrides


def unmet(pins: dict[str, str], resolved: dict[str, str], overrides: list[str]) -> list[str]:
    """One line per pinned package the venv resolves to another version (overrides excepted)."""
    skipped = {canonicalize_name(Requirement(line).name) for line in overrides}
    return [
        f"{name}: TensorRT-LLM's image has {version}, the venv resolves {resolved.get(name, 'nothing')}"
        for name, version in sorted(pins.items())
        if name not in skipped and resolved.get(name) != version
    ]


def _resolved_in(python: str, names: list[str]) -> dict[str, str]:
    script = (
        "import json, sys\nfrom importlib import metadata\nout = {}\nfor n in sys.argv[1:]:\n    try:\n"
        "        out[n] = metadata.version(n)\n    except metadata.PackageNotFoundError:\n        pass\n"
        "print(json.dumps(out))"
    )
    return json.loads(subprocess.run([python, "-c", script, *names], check=True, capture_output=True, text=True).stdout)


def _requirement_lines(path: str) -> list[str]:
    with open(path) as f:
        return [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("requirements", help="our requirements.txt (docker/requirements.py's output)")
    parser.add_argument(
        "--verify",
        metavar="VENV_PYTHON",
        help="check that the venv replaced no pinned package but the overrides; exit 1 if it did",
    )
    args = parser.parse_args(argv)
    pins = pinned_requirements()
    constraints, overrides = split(_requirement_lines(args.requirements), pins)
    if args.verify:
        problems = unmet(pins, _resolved_in(args.verify, list(pins)), overrides)
        print("\n".join(problems) or f"{len(pins)} {PINNED_BY} pins kept", file=sys.stderr)
        return 1 if problems else 0
    for line in overrides:
        print(f"override (venv only; {PINNED_BY} keeps its own): {line}", file=sys.stderr)
    print("\n".join(constraints))
    return 0


if __name__ == "__main__":
    sys.exit(main())
