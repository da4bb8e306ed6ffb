"""`python -m service [worker|gateway]` — the inference service's command line.

Deliberately limited to parsing flags into settings and running the process lifecycle; the work lives in
`service.worker`, `service.gateway` and `service.embedded`.

    python -m service                                   # embedded default: gateway :8000/:50051 + in-process worker
    python -m service worker --target smollm2-135m --draft auto --port 8001 --metrics-port 8002
    python -m service worker --target stub --port 8001  # the stub target: tests and the gateway-overhead benchmark
    python -m service gateway --workers localhost:8001 --http-port 8000 --grpc-port 50051
    python -m service gateway --workers dns://deepspec-worker-headless:8001 --api-keys-file /etc/deepspec/keys
    python -m service gateway --workers k8s://deepspec-worker:grpc     # in a pod: watch the Service's EndpointSlices
    python -m service worker --engine-dir /engines/engine --port 8001  # target + draft from its manifest.json
    curl localhost:8000/v1/completions -H 'content-type: application/json' \\
         -d '{"model": "smollm2-135m", "prompt": "def fib(n):", "max_tokens": 64, "temperature": 0}'
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from service.signals import install_stop_signals

#: the subcommands; each one's settings (and, for a worker, the deepspec library) are imported only when it runs
COMMANDS = ("worker", "gateway", "embedded")


def _add_worker_flags(p: argparse.ArgumentParser, embedded: bool = False) -> None:
    from service.worker.settings import ENGINES, QUANTIZATIONS

    g = p.add_argument_group("model")
    # target, draft and dtype default to None here so that settings can tell a flag from the --engine-dir manifest
    g.add_argument("--target", default=None,
                   help="target alias, HF directory or GGUF file (default smollm2-135m; 'stub' = weightless test target)")
    g.add_argument("--draft", default=None,
                   help="draft directory, 'prompt-lookup', 'none' (target only) or 'auto' (best shipped draft; default)")
    g.add_argument("--engine-dir", default=None,
                   help="engine directory from `python -m export` (format pytorch): target, draft and dtype come from "
                        "its manifest.json; --target/--draft/--dtype given as well win")
    g.add_argument("--engine", choices=ENGINES, default=None,
                   help="auto (default): the engine measured fastest on this machine, the PyTorch engine, ONNX "
                        "Runtime on an export made on the first start, or the native CPU decoder (int8, compiled for "
                        "this CPU on the first start), measured once and cached (a minute); pytorch / onnx / native: "
                        "that one. " + _engine_choice_line())
    g.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="(default cpu)")
    g.add_argument("--dtype", choices=["float32", "bfloat16"], default=None, help="weights dtype (default bfloat16: ~2x faster decoding than float32 on CPU)")
    g.add_argument("--quantization", choices=QUANTIZATIONS, default="auto",
                   help="gguf: keep a GGUF target's own 4-bit matmul weights (CPU, bf16; ~2x faster batch-1 decode); "
                        "none: dense weights in --dtype; auto (default): gguf where it applies, else none")
    g.add_argument("--chat-template", default=None,
                   help="chat template for a target that ships none (gemma3-270m): smollm2, qwen, gemma3 or a Jinja "
                        "file (default: the tokenizer's own)")
    g = p.add_argument_group("batching")
    g.add_argument("--max-batch-size", type=int, default=8, help="sequences per engine step (default 8)")
    g.add_argument("--max-queue", type=int, default=64,
                   help="requests waiting for a slot before 'busy' (gateway: 429) (default 64; 0 = no queue)")
    g.add_argument("--max-prefill-tokens-per-step", type=int, default=512,
                   help="prompt tokens prefilled per engine step at most; a burst then streams in waves (default 512)")
    g.add_argument("--max-seq-len", type=int, default=2048, help="context cap in tokens, prompt + output (default 2048)")
    g.add_argument("--num-speculative-tokens", type=int, default=7, help="draft tokens per verify round (default 7)")
    g.add_argument("--stub-step-ms", type=float, default=0.0, help="stub target only: sleep per forward, ms (default 0)")
    if not embedded:
        g = p.add_argument_group("serving")
        g.add_argument("--host", default="0.0.0.0", help="bind address (default 0.0.0.0)")
        g.add_argument("--port", type=int, default=8001, help="KServe v2 gRPC port (default 8001; 0 = any free)")
        g.add_argument("--metrics-port", type=int, default=8002,
                       help="Prometheus /metrics HTTP port (default 8002; 0 = any free; -1 = off)")
        g.add_argument("--drain-timeout-s", type=float, default=30.0,
                       help="seconds to finish in-flight requests after SIGTERM (default 30)")


def _engine_choice_line() -> str:
    """What --engine auto serves on this machine with the default settings (read from its cache; --help never
    measures or fails for it)."""
    try:
        from service.worker.fastest_engine import describe_cached_choice
        from service.worker.settings import WorkerSettings

        line = describe_cached_choice(WorkerSettings())
    except Exception as e:  # noqa: BLE001 - a help text must print whatever the cache holds
        return f"(The cached choice could not be read: {e}.)"
    return f"On this machine, for the default target and draft: {line}." if line else \
        "Not measured yet on this machine for the default target and draft: the first start measures it."


def _add_gateway_flags(p: argparse.ArgumentParser, embedded: bool = False) -> None:
    g = p.add_argument_group("gateway")
    if not embedded:
        g.add_argument("--workers", required=True,
                       help="comma-separated host:port list, dns://<headless-service>:<port> (re-resolved every 5 s), "
                            "or k8s://<service>[.<namespace>]:<port-name|number> (its EndpointSlices, watched); a listed "
                            "worker may name its protocol: grpc://host:port or openai+http://host:port")
        g.add_argument("--worker-protocol", choices=["kserve-grpc", "openai-http"], default=None,
                       help="what workers without a scheme speak: KServe v2 gRPC (default) or an OpenAI-compatible "
                            "HTTP server (vLLM, SGLang, trtllm-serve, llama.cpp), probed at its /health")
        g.add_argument("--openai-max-outstanding", type=int, default=None,
                       help="requests in flight on one OpenAI worker at most; past it the worker counts as saturated "
                            "(429 when all are). Default 0 = no cap")
        g.add_argument("--discovery", choices=["static", "dns", "endpointslices"], default=None,
                       help="how --workers is found (default: implied by its scheme; with this flag the scheme may be "
                            "left out). endpointslices watches the Kubernetes API from the pod: needs list/watch on "
                            "endpointslices; namespace from k8s://<service>.<namespace>, else $POD_NAMESPACE")
        g.add_argument("--k8s-api-url", default=None,
                       help="Kubernetes API base URL for --discovery endpointslices "
                            "(default: in-cluster, https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)")
    g.add_argument("--host", default="0.0.0.0", help="bind address (default 0.0.0.0)")
    g.add_argument("--http-port", type=int, default=8000, help="OpenAI HTTP API + /health + /metrics (default 8000)")
    g.add_argument("--grpc-port", type=int, default=50051, help="deepspec.v1 gRPC API (default 50051; -1 = off)")
    g.add_argument("--drain-timeout-s", type=float, default=30.0,
                   help="seconds to finish in-flight requests after SIGTERM; readiness turns false first (default 30)")
    g.add_argument("--api-keys-file", default=None,
                   help="file with one API key per line (also $DEEPSPEC_API_KEYS, comma-separated); unset = no auth")
    g.add_argument("--request-timeout-s", type=float, default=600.0, help="whole-request limit, seconds (default 600)")
    g.add_argument("--health-interval-s", type=float, default=2.0, help="seconds between worker probes (default 2)")
    g.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024,
                   help="larger request bodies get 413 (default 4194304 = 4 MiB)")
    if not embedded:  # embedded's --metrics-port is its worker's
        g.add_argument("--metrics-port", type=int, default=None,
                       help="serve /metrics on this port only, not on the HTTP API port (default: on --http-port)")
        g.add_argument("--ready-without-workers", action="store_true", default=None,
                       help="keep /health/ready at 200 while no worker is admitted; completions then answer "
                            "503 + Retry-After (Kubernetes: a worker outage keeps the gateways in their Service)")


def build_parser(commands: tuple[str, ...] = COMMANDS) -> argparse.ArgumentParser:
    """Every subcommand, with the flags of those in `commands` (the gateway image, which has no deepspec library,
    builds only the gateway's)."""
    epilog = __doc__
    if not set(commands) & set(COMMANDS):  # the top-level --help: say which engine `python -m service` serves here
        epilog += "\nEngine (worker --engine auto): " + _engine_choice_line() + "\n"
    parser = argparse.ArgumentParser(prog="python -m service", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=epilog)  # fmt: skip
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (default INFO; request lines are INFO)")
    sub = parser.add_subparsers(dest="command")
    worker = sub.add_parser("worker", parents=[common], help="host one engine behind KServe v2 gRPC")
    gateway = sub.add_parser("gateway", parents=[common], help="OpenAI HTTP + gRPC API routing to workers")
    embedded = sub.add_parser("embedded", parents=[common],
                              help="gateway + one in-process worker (the default without a subcommand)")
    if "worker" in commands:
        _add_worker_flags(worker)
    if "gateway" in commands:
        _add_gateway_flags(gateway)
    if "embedded" in commands:
        _add_gateway_flags(embedded, embedded=True)
        _add_worker_flags(embedded, embedded=True)
        embedded.add_argument("--worker-port", type=int, default=0,
                              help="in-process worker's gRPC port (default 0 = any free)")
        embedded.add_argument("--metrics-port", type=int, default=8002,
                              help="worker /metrics HTTP port (default 8002; -1 = off)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in (*COMMANDS, "-h", "--help"):
        argv = ["embedded", *argv]  # `python -m service [flags]` = the embedded default
    parser = build_parser(commands=tuple(argv[:1]))
    args = parser.parse_args(argv)
    from service.logging import configure_logging

    configure_logging(args.log_level)
    from pydantic import ValidationError

    from service.gateway.settings import GatewaySettings

    try:
        if args.command == "worker":
            from service.worker.settings import WorkerSettings

            settings = WorkerSettings(**_pick(args, WorkerSettings))
            return _run(_serve_worker(settings))
        gateway_args = _pick(args, GatewaySettings)
        if args.command == "embedded":
            gateway_args.pop("metrics_port", None)  # the in-process worker's flag
        gateway_settings = GatewaySettings(**gateway_args)
        if args.command == "gateway":
            from service.gateway.app import serve_gateway

            return _run(serve_gateway(gateway_settings))
        from service.worker.settings import WorkerSettings

        worker_settings = WorkerSettings(**{**_pick(args, WorkerSettings), "port": args.worker_port, "host": "127.0.0.1"})
        from service.embedded import serve_embedded

        return _run(serve_embedded(gateway_settings, worker_settings))
    except ValidationError as e:
        parser.error("; ".join(f"--{'-'.join(map(str, err['loc'])).replace('_', '-')}: {err['msg']}" if err["loc"]
                               else err["msg"].removeprefix("Value error, ") for err in e.errors()))  # fmt: skip
    return 2


def _pick(args: argparse.Namespace, model) -> dict:
    return {k: v for k, v in vars(args).items() if k in model.model_fields and v is not None}


def _run(coro) -> int:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


async def _serve_worker(settings) -> int:
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
