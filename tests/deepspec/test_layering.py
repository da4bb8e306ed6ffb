"""The layers import downward only.

- No stage imports another (training, export, service, loadtest): each imports the library (deepspec/), the worker
  protocol (deepspec_protocol/) and the verification ops (plugins/); the worker reaches export only through its
  library call (export/api.py). The console-script dispatcher (deepspec/cli.py) starts the stages; bench/ and tests/
  are above them all.

- The model layer never imports the decoding layer: deepspec.models sits below deepspec.decoding, whose drafter
  registry maps names and draft directories to Drafters (an import the other way would bring back the cycle).
- The verification ops (plugins/) sit below the engine, which calls them (deepspec/decoding/verify.py): plugins/
  imports nothing of the deepspec library and no stage. A run of the engine through the kernels is
  bench/gpu_check's job.
- The load tester (loadtest/) sees a server only through its public API (HTTP, the gRPC protos under service/) and
  reads its own data: it imports nothing of the deepspec library.
- No module imports itself back through others, lazy imports included: a cycle means two modules hold one concept
  (the registry passes its loader to the hybrid's instead of being imported by it).
- The Target protocol (deepspec/models/target.py) is the only way into a target: no module above the model layer
  reads a target's decoder (`target.model`, or the `_model` the concrete classes keep it in; an exporter asks
  `pytorch_decoder`), and the service loads every target through `load_target` and every drafter through the
  registry, never the ONNX backend's own loaders.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import deepspec

MODELS = Path(deepspec.__file__).parent / "models"
ROOT = MODELS.parent.parent
#: what plugins/ must not import: the library whose engine calls it, and every stage above the library
ABOVE_PLUGINS = ("deepspec", "service", "training", "export", "loadtest", "bench")


def test_importing_every_models_module_loads_no_decoding_module():
    modules = sorted(".".join(p.relative_to(MODELS.parent.parent).with_suffix("").parts) for p in MODELS.rglob("*.py"))
    modules = [m.removesuffix(".__init__") for m in modules]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "import deepspec.models as dm\n"
        "for name in dm.__all__: getattr(dm, name)\n"
        "print(sorted(m for m in sys.modules if m.startswith('deepspec.decoding')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def _imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            found.append((node.lineno, str(node.args[0].value)))
    return found


def _is_under(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _offenders(folder: Path, forbidden: tuple[str, ...]) -> list[str]:
    """`path:line imports module` for every import (lazy and dynamic ones included) of a forbidden package."""
    offenders = []
    for path in sorted(folder.rglob("*.py")):
        for line, module in _imported_modules(ast.parse(path.read_text(), str(path))):
            if _is_under(module, forbidden):
                offenders.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return offenders


def test_no_models_source_imports_deepspec_decoding():
    offenders = _offenders(MODELS, ("deepspec.decoding",))
    assert not offenders, offenders


def test_no_plugins_source_imports_the_library_or_a_stage():
    offenders = _offenders(ROOT / "plugins", ABOVE_PLUGINS)
    assert not offenders, offenders


def test_no_loadtest_source_imports_the_library():
    offenders = _offenders(ROOT / "loadtest", ("deepspec",))
    assert not offenders, offenders


def test_the_package_match_is_by_dotted_prefix():  # negative control: the gRPC protos of the public API are allowed
    assert _is_under("deepspec.paths", ("deepspec",)) and _is_under("deepspec", ("deepspec",))
    assert not _is_under("deepspec_protocol.protos.deepspec.v1", ("deepspec",)) and not _is_under(
        "deepspecx", ("deepspec",)
    )
    assert _is_under("deepspec.decoding.engine", ABOVE_PLUGINS) and not _is_under("plugins.kernels", ABOVE_PLUGINS)


def test_the_ast_walk_sees_lazy_and_dynamic_imports():  # negative control: the check above can fail
    tree = ast.parse(
        "def f():\n    from deepspec.decoding.registry import x\n"
        "import importlib\nimportlib.import_module('deepspec.decoding.engine')\n"
        "from deepspec import decoding\n"
    )
    modules = [m for _, m in _imported_modules(tree)]
    assert {"deepspec.decoding.registry", "deepspec.decoding.engine", "deepspec.decoding"} <= set(modules)


#: the packages whose modules must form no import cycle
PACKAGES = ("deepspec", "training", "export", "service", "loadtest", "plugins", "bench")


def _import_graph() -> dict[str, set[str]]:
    """module → the repository modules it imports anywhere in its source (generated gRPC stubs left out)."""
    paths = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "protos" not in path.parts:
                paths[".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")] = path
    return {
        name: _modules_imported_by(ast.parse(path.read_text(), str(path)), set(paths)) - {name}
        for name, path in paths.items()
    }


def _modules_imported_by(tree: ast.AST, modules: set[str]) -> set[str]:
    """The modules of `modules` a source imports: `from pkg import sub` names the submodule pkg.sub only (the
    idiom does not use pkg's namespace), `from pkg import name` the package; lazy and dynamic imports count."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found |= {
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names
            }
        elif isinstance(node, (ast.Import, ast.Call)):
            found |= {m for _, m in _imported_modules(node)}
    return found & modules


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_in_any_stage():
    assert _cycles(_import_graph()) == []


def test_the_cycle_check_finds_a_cycle():  # negative control
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]


#: the shipped code above the model layer, which sees a target only through the Target protocol
ABOVE_MODELS = ("deepspec/decoding", "training", "export", "service", "bench", "plugins", "loadtest")
#: where a target's decoder lives: `DecoderTarget._model` (and the old public name, so it cannot come back)
DECODER_ATTRIBUTES = ("model", "_model")


def _base_name(node: ast.AST) -> str:
    """The last name of an attribute's base: `target` of `target.x`, `target` of `self.target.x`, `load_target` of
    `load_target(spec).x`."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _reads_a_decoder(base: ast.AST, attribute: str) -> bool:
    name = _base_name(base)
    if attribute == "_model":  # private: only its own class reads it (as self._model)
        return name != "self"
    return name == "tgt" or name.lower().endswith("target")


def _decoder_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, source) of every read of a target's decoder: `<target>.model`, `<anything but self>._model`, and the
    same through getattr with a constant name."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in DECODER_ATTRIBUTES:
            if _reads_a_decoder(node.value, node.attr):
                found.append((node.lineno, ast.unparse(node)))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in DECODER_ATTRIBUTES
            and _reads_a_decoder(node.args[0], node.args[1].value)
        ):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_nothing_above_the_model_layer_reads_a_targets_decoder():
    offenders = [
        f"{path.relative_to(ROOT)}:{line} reads {source}"
        for folder in ABOVE_MODELS
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line, source in _decoder_reads(ast.parse(path.read_text(), str(path)))
    ]
    assert not offenders, offenders


def test_the_decoder_scan_sees_every_way_in():  # negative control: the check above can fail
    tree = ast.parse(
        "target.model.head\nself.target.model\ntgt.model\nonnx_target.model\n"
        "load_target('x').model\nt._model\ngetattr(target, 'model')\n"
        "self._model\ncfg.model.algo\ndrafter.model\nself.model\ngetattr(drafter, 'model')\n"
    )
    assert sorted(line for line, _ in _decoder_reads(tree)) == [1, 2, 3, 4, 5, 6, 7]


def test_the_service_loads_targets_and_drafters_only_through_the_one_loader_and_registry():
    """service/worker/engine.py calls `load_target` (which opens an ONNX export too) and `build_drafter` (whose
    loaders run an export's own draft through its graphs): no second path through the ONNX backend's modules."""
    offenders = _offenders(ROOT / "service", ("deepspec.models.onnx_target", "deepspec.decoding.drafters.onnx_graphs"))
    assert not offenders, offenders


#: the stages (python -m <stage>), the library they share, and the protocol the serving stages speak
STAGES = ("training", "export", "service", "loadtest")
LIBRARY, PROTOCOL, VERIFY_OPS = "deepspec", "deepspec_protocol", "plugins"
#: what each package may import of ours: every stage the library, the protocol and the verification ops; the library
#: the ops; the ops and the protocol nothing. The one edge between stages is a library call: the worker exports the
#: ONNX bundle it serves on its first start through export's API (export/api.py), never its CLI or its internals.
ALLOWED_IMPORTS = {
    **{stage: (LIBRARY, PROTOCOL, VERIFY_OPS) for stage in STAGES},
    "service": (LIBRARY, PROTOCOL, VERIFY_OPS, "export.api"),
    LIBRARY: (VERIFY_OPS,),
    PROTOCOL: (),
    VERIFY_OPS: (),
}
#: the console-script dispatcher (`deepspec serve|train|export|...`) starts the stages: the library's one module above
#: them; bench/ and tests/ measure and check every stage and are no stage themselves
DISPATCHERS = ("deepspec/cli.py",)


def _allowed(module: str, allowed: tuple[str, ...]) -> bool:
    """`module` is under an allowed package, or is a package an allowed module sits in (`from export import api`)."""
    return _is_under(module, allowed) or any(a.startswith(module + ".") for a in allowed)


def stage_edges(root: Path) -> list[str]:
    """`path:line imports module` for every import (lazy and dynamic ones included) from one of our packages into
    another that ALLOWED_IMPORTS does not allow."""
    ours = tuple(ALLOWED_IMPORTS)
    offenders = []
    for package, allowed in ALLOWED_IMPORTS.items():
        for path in sorted((root / package).rglob("*.py")):
            if str(path.relative_to(root)) in DISPATCHERS:
                continue
            for line, module in _imported_modules(ast.parse(path.read_text(), str(path))):
                if _is_under(module, ours) and not _is_under(module, (package,)) and not _allowed(module, allowed):
                    offenders.append(f"{path.relative_to(root)}:{line} imports {module}")
    return offenders


def test_no_stage_imports_another_but_through_the_allowed_library_calls():
    offenders = stage_edges(ROOT)
    assert not offenders, offenders


def test_the_stage_check_catches_an_edge(tmp_path):  # negative control: the check above can fail
    for package in ALLOWED_IMPORTS:
        (tmp_path / package).mkdir()
    (tmp_path / "service" / "worker.py").write_text(
        "def f():\n    from export.cli import main\nfrom export.api import export_bundle\nfrom export import api\n"
    )
    (tmp_path / "export" / "triton.py").write_text("import service.gateway.triton_contract\nimport deepspec_protocol\n")
    (tmp_path / "loadtest" / "grpc.py").write_text("import importlib\nimportlib.import_module('service.protos')\n")
    (tmp_path / "deepspec_protocol" / "names.py").write_text("from deepspec.decoding import params\n")
    (tmp_path / "deepspec" / "cli.py").write_text("import service.cli\n")
    assert stage_edges(tmp_path) == [
        "export/triton.py:1 imports service.gateway.triton_contract",
        "service/worker.py:2 imports export.cli",
        "service/worker.py:2 imports export.cli.main",
        "loadtest/grpc.py:2 imports service.protos",
        "deepspec_protocol/names.py:1 imports deepspec.decoding",
        "deepspec_protocol/names.py:1 imports deepspec.decoding.params",
    ]
