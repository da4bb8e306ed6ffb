"""`python -m service` with no subcommand: the gateway plus one in-process worker, on CPU, in one event loop.

The worker is the same `WorkerService` a worker pod runs, bound to 127.0.0.1 on a free port; the gateway routes to
it over gRPC like to any other worker, so the embedded default exercises the production path. The gateway answers
/health/live at once; /health/ready turns true once the worker has loaded its weights and warmed up.
"""

from __future__ import annotations

import logging

from service.settings import GatewaySettings, WorkerSettings

logger = logging.getLogger(__name__)


async def serve_embedded(gateway_settings: GatewaySettings, worker_settings: WorkerSettings) -> int:
    from service.cli import install_stop_signals
    from service.gateway.app import serve_gateway
    from service.worker.server import WorkerService

    stop = install_stop_signals()
    worker = WorkerService(worker_settings)
    await worker.start()
    gateway_settings = gateway_settings.model_copy(update={"workers": f"127.0.0.1:{worker.port}"})

    def on_ready(http_port: int, grpc_port: int | None) -> None:
        host = "localhost" if gateway_settings.host in ("0.0.0.0", "::") else gateway_settings.host
        logger.info(
            "DeepSpec is serving %s (drafter %s): OpenAI API http://%s:%d/v1 · gRPC %s:%s · metrics "
            "http://%s:%d/metrics (gateway), http://%s:%s/metrics (worker)", worker.model_name,
            worker.loaded.drafter_name, host, http_port, host, grpc_port, host, http_port, host, worker.metrics_port,
        )  # fmt: skip

    try:
        return await serve_gateway(gateway_settings, stop=stop, on_ready=on_ready)
    finally:
        await worker.drain(timeout_s=1.0)
