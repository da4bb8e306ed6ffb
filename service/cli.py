"""`python -m service [worker|gateway]` — the inference service's command line.

Deliberately limited to parsing flags into settings and running the process lifecycle; the work lives in
`service.worker`, `service.gateway` and `service.embedded`.

    python -m service                                   # embedded default: gateway :8000/:50051 + in-process worker
    python -m service worker --target smollm2-135m --draft auto --port 8001 --metrics-port 8002
    python -m service worker --target stub --port 8001  # the stub target: tests and the gateway-overhead benchmark
    python -m service gateway --workers localhost:8001 --http-port 8000 --grpc-port 50051
    python -m service gateway --workers dns://deepspec-worker-headless:8001 --api-keys-file /etc/deepspec/keys
    python -m service gateway --workers k8s://deepspec-worker:grpc     # in a pod: watch the Service's EndpointSlices
    python -m service worker --bundle-dir /bundles/cpu --port 8001  # target + draft from its manifest.json
    curl localhost:8000/v1/completions -H 'content-type: application/json' \\
         -d '{"model": "smollm2-135m", "prompt": "def fib(n):", "max_tokens": 64, "temperature": 0}'

Every setting can also come from the environment: DEEPSPEC_WORKER_<FIELD> for a worker (DEEPSPEC_WORKER_PORT=8001),
DEEPSPEC_GATEWAY_<FIELD> for a gateway (DEEPSPEC_GATEWAY_HTTP_PORT=8000), DEEPSPEC_API_KEYS for the keys. A flag
given on the command line wins over the environment; a flag left out leaves the environment (or the default) in
place.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from service.signals import install_stop_signals

if TYPE_CHECKING:
    from service.gateway.settings import GatewaySettings
    from service.worker.settings import WorkerSettings

#: the module docstring: --help's description and epilog ("" where python -OO strips docstrings)
_USAGE = __doc__ or ""

#: an argparse argument group (what add_argument_group returns)
_Group = argparse._ArgumentGroup

#: the subcommands; each one's settings (and, for a worker, the deepspec library) are imported only when it runs
COMMANDS = ("worker", "gateway", "embedded")


def _default(model, name: str) -> str:
    """A settings field's default as the help text shows it. Flags themselves default to None ("not given"): the
    settings model is the one source of defaults, so a flag left out cannot hide the field's environment variable."""
    value = model.model_fields[name].get_default(call_default_factory=True)
    return "none" if value is None else str(value)


def _add_worker_flags(p: argparse.ArgumentParser, embedded: bool = False) -> None:
    from service.worker.settings import WorkerSettings

    d = partial(_default, WorkerSettings)
    _add_model_flags(p.add_argument_group("model"), d)
    _add_batching_flags(p.add_argument_group("batching"), d)
    if not embedded:
        _add_worker_serving_flags(p.add_argument_group("serving"), d)


def _add_model_flags(g: _Group, d: Callable[[str], str]) -> None:
    """What the worker serves: target, draft, backend and weights."""
    from service.worker.settings import BACKENDS, WEIGHT_FORMATS

    g.add_argument(
        "--target",
        help=f"target alias, HF directory or GGUF file (default {d('target')}; 'stub' = weightless test target)",
    )
    g.add_argument(
        "--draft",
        help="draft directory, 'prompt-lookup', 'none' (target only) or 'auto' (best shipped "
        f"draft) (default {d('draft')})",
    )
    g.add_argument(
        "--bundle-dir",
        help="a bundle from `python -m export` (format pytorch or onnx): target, draft and dtype come from "
        "its manifest.json; --target/--draft/--dtype given as well win",
    )
    g.add_argument("--engine-dir", help="deprecated: --bundle-dir")
    g.add_argument(
        "--backend",
        choices=BACKENDS,
        help="auto (default): the inference backend measured fastest on this machine, the PyTorch "
        "decoder, ONNX Runtime on an export made on the first start, or the native CPU decoder "
        "(compiled for this CPU on the first start), measured once and cached (a minute); pytorch / "
        "onnx / native: that one. " + _backend_choice_line(),
    )
    g.add_argument("--engine", choices=BACKENDS, help="deprecated: --backend")
    g.add_argument("--device", choices=["cpu", "cuda"], help=f"(default {d('device')})")
    g.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        help=f"weights dtype (default {d('dtype')}: ~2x faster decoding than float32 on CPU)",
    )
    g.add_argument(
        "--quantization",
        choices=WEIGHT_FORMATS,
        help=f"weight format (default {d('quantization')}: each backend's own). pytorch: none (dense in "
        "--dtype) or gguf (a GGUF target's own 4-bit weights; CPU, bf16); onnx: none, int8 or int4 "
        "(the first start's export); native: int8 or int4. Refused where --backend names one that "
        "does not take it; with --backend auto only the backends that take it are weighed, each in "
        "it (gguf: pytorch, not measured; int8/int4: onnx and native; none: pytorch and onnx)",
    )
    g.add_argument(
        "--chat-template",
        help="chat template for a target that ships none (gemma3-270m): smollm2, qwen, gemma3 or a Jinja "
        "file (default: the tokenizer's own)",
    )


def _add_batching_flags(g: _Group, d: Callable[[str], str]) -> None:
    """How many sequences, queued requests and prompt tokens an engine step takes."""
    g.add_argument("--max-batch-size", type=int, help=f"sequences per engine step (default {d('max_batch_size')})")
    g.add_argument(
        "--max-queue",
        type=int,
        help=f"requests waiting for a slot before 'busy' (gateway: 429) (default {d('max_queue')}; 0 = no queue)",
    )
    g.add_argument(
        "--max-prefill-tokens-per-step",
        type=int,
        help="prompt tokens prefilled per engine step at most; a burst then streams in waves "
        f"(default {d('max_prefill_tokens_per_step')})",
    )
    g.add_argument(
        "--max-seq-len",
        type=int,
        help="context cap in tokens, prompt + output (default: the context the target declares, lowered "
        "only where its KV cache for --max-batch-size sequences would not fit in memory)",
    )
    g.add_argument(
        "--num-speculative-tokens",
        type=int,
        help=f"draft tokens per verify round (default {d('num_speculative_tokens')})",
    )
    g.add_argument(
        "--planner",
        choices=["budget", "verify-all"],
        help="budget: verify only the depths this machine's step curve says pay; verify-all: every proposed "
        f"token, however full the batch (default {d('planner')})",
    )
    g.add_argument(
        "--stub-step-ms", type=float, help=f"stub target only: sleep per forward, ms (default {d('stub_step_ms')})"
    )


def _add_worker_serving_flags(g: _Group, d: Callable[[str], str]) -> None:
    """A standalone worker's address, ports and drain (an embedded worker's come from the gateway's flags)."""
    g.add_argument("--host", help=f"bind address (default {d('host')})")
    g.add_argument("--port", type=int, help=f"KServe v2 gRPC port (default {d('port')}; 0 = any free)")
    g.add_argument(
        "--metrics-port",
        type=int,
        help=f"Prometheus /metrics HTTP port (default {d('metrics_port')}; 0 = any free; -1 = off)",
    )
    g.add_argument(
        "--drain-timeout-s",
        type=float,
        help=f"seconds to finish in-flight requests after SIGTERM (default {d('drain_timeout_s')})",
    )


def _backend_choice_line() -> str:
    """What --backend auto serves on this machine with the default settings (read from its cache; --help never
    measures or fails for it)."""
    try:
        from service.worker.fastest_backend import describe_cached_choice
        from service.worker.settings import WorkerSettings

        line = describe_cached_choice(WorkerSettings())
    except Exception as e:
        return f"(The cached choice could not be read: {e}.)"
    return (
        f"On this machine, for the default target and draft: {line}."
        if line
        else "Not measured yet on this machine for the default target and draft: the first start measures it."
    )


def _add_gateway_flags(p: argparse.ArgumentParser, embedded: bool = False) -> None:
    from service.gateway.settings import GatewaySettings

    d = partial(_default, GatewaySettings)
    g = p.add_argument_group("gateway")
    if not embedded:
        _add_worker_discovery_flags(g, d)
    _add_gateway_serving_flags(g, d)
    g = p.add_argument_group("admission and routing")
    _add_admission_flags(g, d)
    if not embedded:  # embedded's --metrics-port is its worker's
        _add_standalone_gateway_flags(g)


def _add_worker_discovery_flags(g: _Group, d: Callable[[str], str]) -> None:
    """Where a standalone gateway finds its workers and what they speak."""
    g.add_argument(
        "--workers",
        help="comma-separated host:port list, dns://<headless-service>:<port> (re-resolved every 5 s), "
        "or k8s://<service>[.<namespace>]:<port-name|number> (its EndpointSlices, watched); a listed "
        "worker may name its protocol: grpc://host:port or openai+http://host:port. Required, "
        "here or as DEEPSPEC_GATEWAY_WORKERS",
    )
    g.add_argument(
        "--worker-protocol",
        choices=["kserve-grpc", "openai-http"],
        help="what workers without a scheme speak: KServe v2 gRPC (default) or an OpenAI-compatible "
        "HTTP server (vLLM, SGLang, trtllm-serve, llama.cpp), probed at its /health",
    )
    g.add_argument(
        "--openai-max-outstanding",
        type=int,
        help="requests in flight on one OpenAI worker at most; past it the worker counts as saturated "
        f"(429 when all are). Default {d('openai_max_outstanding')} = no cap",
    )
    g.add_argument(
        "--discovery",
        choices=["static", "dns", "endpointslices"],
        help="how --workers is found (default: implied by its scheme; with this flag the scheme may be "
        "left out). endpointslices watches the Kubernetes API from the pod: needs list/watch on "
        "endpointslices; namespace from k8s://<service>.<namespace>, else $POD_NAMESPACE",
    )
    g.add_argument(
        "--k8s-api-url",
        help="Kubernetes API base URL for --discovery endpointslices "
        "(default: in-cluster, https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)",
    )


def _add_gateway_serving_flags(g: _Group, d: Callable[[str], str]) -> None:
    """The gateway's address, ports, drain, keys and request limits."""
    g.add_argument("--host", help=f"bind address (default {d('host')})")
    g.add_argument("--http-port", type=int, help=f"OpenAI HTTP API + /health + /metrics (default {d('http_port')})")
    g.add_argument("--grpc-port", type=int, help=f"deepspec.v1 gRPC API (default {d('grpc_port')}; -1 = off)")
    g.add_argument(
        "--drain-timeout-s",
        type=float,
        help="seconds to finish in-flight requests after SIGTERM; readiness turns false first "
        f"(default {d('drain_timeout_s')})",
    )
    g.add_argument(
        "--api-keys-file",
        help="file with one API key per line (also $DEEPSPEC_API_KEYS, comma-separated); unset = no auth",
    )
    g.add_argument(
        "--request-timeout-s", type=float, help=f"whole-request limit, seconds (default {d('request_timeout_s')})"
    )
    g.add_argument(
        "--health-interval-s", type=float, help=f"seconds between worker probes (default {d('health_interval_s')})"
    )
    g.add_argument("--max-body-bytes", type=int, help=f"larger request bodies get 413 (default {d('max_body_bytes')})")


def _add_admission_flags(g: _Group, d: Callable[[str], str]) -> None:
    """Service classes, the admission queue and the routing policy."""
    g.add_argument(
        "--service-classes-file",
        help="YAML/JSON per API key: service_class (interactive|standard|batch), weight, tokens_per_minute, "
        "ttft_objective_s, session_memory (service/gateway/service_classes.py); its keys are accepted "
        "API keys too. Unset = every caller gets the standard class",
    )
    g.add_argument("--service-classes", help="the same as inline YAML/JSON text (the file wins where both are given)")
    g.add_argument(
        "--max-inflight-per-worker",
        type=int,
        help="requests in flight per admitted worker before the rest wait in the gateway's queue "
        f"(default {d('max_inflight_per_worker')} = no cap of its own)",
    )
    g.add_argument(
        "--interactive-reserve-per-worker",
        type=int,
        help="slots per worker past --max-inflight-per-worker only the interactive class may take "
        f"(default {d('interactive_reserve_per_worker')})",
    )
    g.add_argument(
        "--max-waiting",
        type=int,
        help="requests the admission queue holds; past it the lowest class is shed with 429 + Retry-After "
        f"(default {d('max_waiting')}; 0 = answer 429 at once when the pool is saturated)",
    )
    g.add_argument(
        "--queue-timeout-s",
        type=float,
        help=f"seconds a request may wait in the queue when its key sets no objective (default {d('queue_timeout_s')})",
    )
    g.add_argument(
        "--routing",
        choices=["goodput", "p2c"],
        help="goodput: score workers by the tokens/s a request would get there, keep sessions on their "
        f"worker; p2c: power of two choices on outstanding requests (default {d('routing')})",
    )
    g.add_argument(
        "--routing-load-max-age-s",
        type=float,
        help="seconds a worker's load report stays fresh; past it the pick falls back to p2c "
        f"(default {d('routing_load_max_age_s')})",
    )


def _add_standalone_gateway_flags(g: _Group) -> None:
    """A standalone gateway's own metrics port and readiness without workers."""
    g.add_argument(
        "--metrics-port",
        type=int,
        help="serve /metrics on this port only, not on the HTTP API port (default: on --http-port)",
    )
    g.add_argument(
        "--ready-without-workers",
        action="store_true",
        default=None,
        help="keep /health/ready at 200 while no worker is admitted; completions then answer "
        "503 + Retry-After (Kubernetes: a worker outage keeps the gateways in their Service)",
    )


def _add_embedded_flags(p: argparse.ArgumentParser) -> None:
    from service.worker.settings import EmbeddedWorkerSettings

    _add_gateway_flags(p, embedded=True)
    _add_worker_flags(p, embedded=True)
    p.add_argument(
        "--worker-port",
        type=int,
        dest="port",
        help=f"in-process worker's gRPC port (default {_default(EmbeddedWorkerSettings, 'port')} = any "
        "free; DEEPSPEC_WORKER_PORT)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        help=f"worker /metrics HTTP port (default {_default(EmbeddedWorkerSettings, 'metrics_port')}; -1 = off)",
    )


def build_parser(commands: tuple[str, ...] = COMMANDS) -> argparse.ArgumentParser:
    """Every subcommand, with the flags of those in `commands` (the gateway image, which has no deepspec library,
    builds only the gateway's)."""
    epilog = _USAGE
    if not set(commands) & set(COMMANDS):  # the top-level --help: say which backend `python -m service` serves here
        epilog += "\nBackend (worker --backend auto): " + _backend_choice_line() + "\n"
    parser = argparse.ArgumentParser(
        prog="python -m service",
        description=_USAGE.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=epilog,
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--log-level", default="INFO", help="DEBUG, INFO, WARNING (default INFO; request lines are INFO)"
    )
    sub = parser.add_subparsers(dest="command")
    worker = sub.add_parser("worker", parents=[common], help="host one engine behind KServe v2 gRPC")
    gateway = sub.add_parser("gateway", parents=[common], help="OpenAI HTTP + gRPC API routing to workers")
    embedded = sub.add_parser(
        "embedded", parents=[common], help="gateway + one in-process worker (the default without a subcommand)"
    )
    if "worker" in commands:
        _add_worker_flags(worker)
    if "gateway" in commands:
        _add_gateway_flags(gateway)
    if "embedded" in commands:
        _add_embedded_flags(embedded)
    return parser


@dataclass
class ServiceConfig:
    """What one command runs: a gateway's settings, a worker's, or both (embedded)."""

    command: str
    gateway: GatewaySettings | None = None
    worker: WorkerSettings | None = None
    log_level: str = "INFO"

    def gateway_settings(self) -> GatewaySettings:
        if self.gateway is None:
            raise ValueError(f"the {self.command} command runs no gateway")
        return self.gateway

    def worker_settings(self) -> WorkerSettings:
        if self.worker is None:
            raise ValueError(f"the {self.command} command runs no worker")
        return self.worker


def parse_config(argv: list[str] | None = None) -> ServiceConfig:
    """Flags and the environment -> settings, as `main` builds them (tests build them the same way). Only the flags
    given reach the settings models, whose own fields (and their DEEPSPEC_* variables) fill the rest. Exits with a
    usage error naming the flag for a bad value."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in (*COMMANDS, "-h", "--help"):
        argv = ["embedded", *argv]  # `python -m service [flags]` = the embedded default
    parser = build_parser(commands=tuple(argv[:1]))
    args = parser.parse_args(argv)
    from pydantic import ValidationError

    try:
        config = _settings(args)
    except ValidationError as e:
        parser.error(
            "; ".join(
                f"--{'-'.join(map(str, err['loc'])).replace('_', '-')}: {err['msg']}"
                if err["loc"]
                else err["msg"].removeprefix("Value error, ")
                for err in e.errors()
            )
        )
    except ValueError as e:
        parser.error(str(e))
    config.log_level = args.log_level
    return config


def _settings(args: argparse.Namespace) -> ServiceConfig:
    if args.command == "worker":
        from service.worker.settings import WorkerSettings

        return ServiceConfig("worker", worker=WorkerSettings(**_given(args, WorkerSettings)))
    from service.gateway.settings import GatewaySettings

    if args.command == "gateway":
        gateway = GatewaySettings(**_given(args, GatewaySettings))
        if not gateway.workers:
            raise ValueError("the gateway needs workers: pass --workers or set DEEPSPEC_GATEWAY_WORKERS")
        return ServiceConfig("gateway", gateway=gateway)
    from service.worker.settings import EmbeddedWorkerSettings

    worker_fields = {"metrics_port", "port"}  # embedded's flags of these name its in-process worker's
    gateway = GatewaySettings(**{k: v for k, v in _given(args, GatewaySettings).items() if k not in worker_fields})
    worker_args = {k: v for k, v in _given(args, EmbeddedWorkerSettings).items() if k != "host"}  # host: gateway's
    return ServiceConfig("embedded", gateway=gateway, worker=EmbeddedWorkerSettings(**worker_args))


def _given(args: argparse.Namespace, model) -> dict:
    """The flags given on the command line that name a field of `model` (argparse leaves the others None)."""
    return {k: v for k, v in vars(args).items() if k in model.model_fields and v is not None}


def main(argv: list[str] | None = None) -> int:
    config = parse_config(argv)
    from service.logging import configure_logging

    configure_logging(config.log_level)
    if config.command == "worker":
        return _run(_serve_worker(config.worker_settings()))
    if config.command == "gateway":
        from service.gateway.app import serve_gateway

        return _run(serve_gateway(config.gateway_settings()))
    from service.embedded import serve_embedded

    return _run(serve_embedded(config.gateway_settings(), config.worker_settings()))


def _run(coro) -> int:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


async def _serve_worker(settings: WorkerSettings) -> int:
    from service.worker.server import WorkerService

    worker = WorkerService(settings)
    stop = install_stop_signals()
    try:
        await worker.start()
    except (ValueError, OSError, RuntimeError) as e:  # bad target/draft, missing file, port in use
        logging.getLogger("service").error("the worker failed to start: %s", e)
        await worker.stop()
        return 1
    await stop.wait()
    logging.getLogger("service").info("SIGTERM: draining for up to %.0f s", settings.drain_timeout_s)
    await worker.drain()
    return 0
