"""Print requirement lines from pyproject.toml, so a Docker layer can install dependencies before the source
is copied (and stay cached while only code changes).

    python docker/requirements.py --extras serve export > requirements.txt      # core + extras
    python docker/requirements.py --extras serve --exclude torch transformers   # leave some out
    python docker/requirements.py --only torch                                   # one pin, e.g. for another index

Standard library only (tomllib, Python >= 3.11): it runs in a bare base image.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path


def requirement_name(requirement: str) -> str:
    """`uvicorn[standard]>=0.30` -> `uvicorn` (normalized: lower case, `_` and `.` as `-`)."""
    name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if name is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", name.group(1)).lower()


def requirements(pyproject: Path, extras: list[str], exclude: list[str], only: list[str]) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise SystemExit(f"unknown extras {unknown}; pyproject.toml has {sorted(optional)}")
    lines = list(project.get("dependencies", []))
    for extra in extras:
        lines += optional[extra]
    excluded = {requirement_name(n) for n in exclude}
    wanted = {requirement_name(n) for n in only}
    seen, out = set(), []
    for line in lines:
        if line in seen or requirement_name(line) in excluded or (wanted and requirement_name(line) not in wanted):
            continue
        seen.add(line)
        out.append(line)
    missing = wanted - {requirement_name(line) for line in out}
    if missing:
        raise SystemExit(f"{sorted(missing)} not among the requirements of pyproject.toml")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--pyproject", type=Path, default=Path("pyproject.toml"), help="(default ./pyproject.toml)")
    parser.add_argument("--extras", nargs="*", default=[], help="optional-dependency groups to add")
    parser.add_argument("--exclude", nargs="*", default=[], help="package names to leave out")
    parser.add_argument("--only", nargs="*", default=[], help="print only these packages' lines")
    args = parser.parse_args(argv)
    print("\n".join(requirements(args.pyproject, args.extras, args.exclude, args.only)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
