"""The service's modules import each other without a cycle, lazy imports inside functions included.

A cycle held together by a lazy import (`service.cli` -> `service.gateway.app` -> `service.cli`) works until someone
moves the import to the top; the graph is read from the source with `ast`, so such edges count too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of `package` it imports anywhere in its source (package `__init__`s left out)."""
    files = {_module_name(p): p for p in (REPO / package).rglob("*.py")}
    modules = {name for name, path in files.items() if path.name != "__init__.py"}
    graph: dict[str, set[str]] = {}
    for name in modules:
        edges = set()
        for node in ast.walk(ast.parse(files[name].read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # `from service.gateway import errors` imports the module service.gateway.errors
                targets = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
            else:
                continue
            edges |= {t for t in targets if t in modules and t != name}
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_lazy_cycle():
    graph = {"a.cli": {"a.app"}, "a.app": {"a.cli"}, "a.embedded": {"a.app"}}
    assert cycles(graph) == [["a.app", "a.cli"]]


def test_cli_embedded_and_gateway_app_do_not_import_each_other_in_a_cycle():
    graph = import_graph("service")
    assert {"service.cli", "service.embedded", "service.gateway.app"} <= set(graph)
    assert "service.cli" not in graph["service.gateway.app"] | graph["service.embedded"]
    assert cycles(graph) == []


@pytest.mark.parametrize("module", ["service.cli", "service.embedded", "service.gateway.app"])
def test_each_imports_first_in_a_fresh_interpreter(module):
    result = subprocess.run(
        [sys.executable, "-c", f"import {module}"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-2000:]
