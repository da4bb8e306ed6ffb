"""No function over 80 lines in the library and the stages (deepspec/, training/, export/, service/): a longer one
holds several steps that want names of their own (issue 23). Generated gRPC stubs are left out."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("deepspec", "training", "export", "service")
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


def test_the_length_check_counts_decorators_out_and_nested_functions_in():  # negative control
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    assert _long_functions(f"@decorator\ndef f():\n{body}\n") == [("f", 81)]
    assert _long_functions(f"def g():\n    def h():\n    {body.replace(chr(10), chr(10) + '    ')}\n") == [
        ("g", 82),
        ("h", 81),
    ]
