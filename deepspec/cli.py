"""`deepspec` — the console script: one command for every stage, each delegating to that stage's own `main`.

    deepspec serve [flags]          # python -m service: gateway + in-process worker (the embedded default)
    deepspec worker [flags]         # python -m service worker
    deepspec gateway [flags]        # python -m service gateway
    deepspec train <step> [flags]   # python -m training (prepare, train, corpus, eval, ...)
    deepspec export [flags]         # python -m export
    deepspec loadtest [flags]       # python -m loadtest
    deepspec plugins <build|check>  # python -m plugins

`deepspec <command> --help` prints that stage's flags. This is the one module above the stages: the library below
it never imports a stage, so the stages are named here as `module:function` strings and imported only when their
command runs (as a `console_scripts` table names them): `deepspec gateway` imports the service stage alone.
"""

from __future__ import annotations

import importlib
import sys

#: command -> (the stage's `module:function` entry point, the arguments put before the user's)
COMMANDS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "serve": ("service.cli:main", ("embedded",), "OpenAI-compatible server: gateway + one in-process worker"),
    "worker": ("service.cli:main", ("worker",), "one engine behind KServe v2 gRPC"),
    "gateway": ("service.cli:main", ("gateway",), "OpenAI HTTP + gRPC API routing to workers"),
    "train": ("training.__main__:main", (), "regenerate, train and evaluate drafts"),
    "export": ("export.cli:main", (), "a target + draft -> what vLLM, SGLang, TensorRT-LLM, ONNX Runtime load"),
    "loadtest": ("loadtest.cli:main", (), "load generator with SLO goodput and spec-decode statistics"),
    "plugins": ("plugins.__main__:main", (), "build or check the verification ops"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {summary}" for name, (_, _, summary) in COMMANDS.items()]
    return "usage: deepspec <command> [flags]   (deepspec <command> --help for its flags)\n\ncommands:\n" + "\n".join(
        lines
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"deepspec: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        return 2
    target, prefix, _ = COMMANDS[command]
    module, function = target.split(":")
    entry = getattr(importlib.import_module(module), function)
    return int(entry([*prefix, *rest]) or 0)
