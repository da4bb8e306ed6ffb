"""`python -m service` with no subcommand: the gateway plus one in-process worker, on CPU, in one event loop.

The worker is the same `WorkerService` a worker pod runs, bound to 127.0.0.1 on a free port; the gateway routes to
it over gRPC like to any other worker, so the embedded default exercises the production path. The gateway answers
/health/live at once; /health/ready turns true once the worker has loaded its weights and warmed up.
"""

from __future__ import annotations

import logging

from service.gateway.settings import GatewaySettings
from service.worker.settings import WorkerSettings

logger = logging.getLogger(__name__)


async def serve_embedded(gateway_settings: GatewaySettings, worker_settings: WorkerSettings) -> int:
    import asyncio

    from service.gateway.app import serve_gateway
    from service.signals import install_stop_signals
    from service.worker.server import WorkerService

    stop = install_stop_signals()
    worker = WorkerService(worker_settings)
    await worker.bind()  # the port is known now; weights load while the gateway already answers /health/live
    loading = asyncio.create_task(worker.load())
    gateway_settings = gateway_settings.model_copy(update={"workers": f"127.0.0.1:{worker.port}"})
    host = "localhost" if gateway_settings.host in ("0.0.0.0", "::") else gateway_settings.host
    urls: dict[str, object] = {}

    def announce() -> None:
        """Log the URLs once both the gateway listens and the worker is warm (either may come first)."""
        done = loading.done() and not loading.cancelled() and loading.exception() is None
        if urls and done and worker.loaded is not None:  # loaded is set once load() succeeded
            logger.info(
                "DeepSpec is serving %s (drafter %s): OpenAI API %s/v1 · gRPC %s · metrics %s/metrics (gateway), "
                "http://%s:%s/metrics (worker)",
                worker.model_name,
                worker.loaded.drafter_name,
                urls["http"],
                urls["grpc"],
                urls["http"],
                host,
                worker.metrics_port,
            )

    def on_gateway_up(http_port: int, grpc_port: int | None) -> None:
        urls.update(http=f"http://{host}:{http_port}", grpc=None if grpc_port is None else f"{host}:{grpc_port}")
        if not loading.done():
            logger.info(
                "gateway up at %s/v1 (gRPC %s); loading %s, /health/ready turns 200 once it is warm",
                urls["http"],
                urls["grpc"],
                worker_settings.target,
            )
        announce()

    def on_loaded(task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.error("the worker failed to load %s: %s", worker_settings.target, task.exception())
            stop.set()
            return
        announce()

    loading.add_done_callback(on_loaded)
    try:
        code = await serve_gateway(gateway_settings, stop=stop, on_ready=on_gateway_up)
    finally:
        loading.cancel()
        await worker.drain(timeout_s=1.0)
    if not loading.cancelled() and loading.done() and loading.exception() is not None:
        return 1
    return code
