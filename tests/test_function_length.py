"""No function over 80 lines in any package the wheel installs (pyproject.toml's [tool.setuptools.packages.find]):
a longer one holds several steps that want names of their own (issues 23 and 43). Generated gRPC stubs are left out.
A test keeps PACKAGES in step with that include list, so a package added there is checked too."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("deepspec", "deepspec_protocol", "training", "export", "plugins", "service", "loadtest")
MAX_LINES = 80


def _lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    assert node.end_lineno is not None  # ast.parse sets every node's positions
    return node.end_lineno - node.lineno + 1


def _long_functions(source: str, max_lines: int = MAX_LINES) -> list[tuple[str, int]]:
    return [
        (node.name, _lines(node))
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _lines(node) > max_lines
    ]


def test_no_function_is_over_80_lines():
    offenders = [
        f"{path.relative_to(ROOT)}: {name} ({lines} lines)"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "protos" not in path.parts
        for name, lines in _long_functions(path.read_text())
    ]
    assert not offenders, offenders


def test_packages_are_every_package_the_wheel_installs():
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert sorted(PACKAGES) == sorted(pattern.removesuffix("*") for pattern in find["include"])


def test_the_length_check_counts_decorators_out_and_nested_functions_in():  # negative control
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    assert _long_functions(f"@decorator\ndef f():\n{body}\n") == [("f", 81)]
    assert _long_functions(f"def g():\n    def h():\n    {body.replace(chr(10), chr(10) + '    ')}\n") == [
        ("g", 82),
        ("h", 81),
    ]
