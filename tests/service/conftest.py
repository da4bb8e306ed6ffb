"""Real servers for the service tests: `python -m service worker|gateway` processes on free ports.

Like vLLM's `RemoteOpenAIServer`: pick a free port, start the process, poll its health, fail with its log if it
dies, terminate it on exit. Most tests use the stub target under the real engine (`--target stub`), which starts in
about a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Self

import httpx
import pytest

from tests.ports import free_port

if TYPE_CHECKING:
    import numpy as np
    import tritonclient.grpc as triton

    from service.cli import ServiceConfig
    from service.gateway.routing import WorkerPool
    from service.gateway.settings import GatewaySettings
    from service.worker.settings import WorkerSettings

REPO = Path(__file__).resolve().parents[2]
#: how long a server may take to start: a stub worker is up in seconds on an idle machine, but its first import of
#: torch's compiler stack (the verify ops) takes minutes on cores shared with other jobs. Only a failure waits it out.
STARTUP_TIMEOUT_S = 300.0


class ServerProcess:
    def __init__(self, args: list[str], log_path: Path, env: dict | None = None):
        self.args, self.log_path = args, log_path
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None

    def start(self) -> Self:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (the server writes it until terminate() closes it)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service", *self.args],
            cwd=REPO,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        return self

    @property
    def process(self) -> subprocess.Popen:
        """The server's process, once start() has run."""
        if self.proc is None:
            raise RuntimeError(f"{' '.join(self.args[:1])} server not started: call start() first")
        return self.proc

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_until(self, check, timeout_s: float = STARTUP_TIMEOUT_S, what: str = "ready") -> None:
        proc = self.process
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"server exited with {proc.returncode} before {what}:\n{self.log()[-4000:]}")
            try:
                if check():
                    return
            except Exception:
                pass
            time.sleep(0.1)
        pytest.fail(f"server not {what} after {timeout_s} s:\n{self.log()[-4000:]}")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def terminate(self, timeout_s: float = 15.0) -> int:
        proc = self.process
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self._log.close()
        return proc.returncode


class Worker(ServerProcess):
    def __init__(self, tmp: Path, *extra: str, port: int | None = None, name: str = "worker"):
        self.port = port or free_port()
        self.metrics_port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        super().__init__(
            [
                "worker",
                "--target",
                "stub",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--metrics-port",
                str(self.metrics_port),
                "--drain-timeout-s",
                "2",
                *extra,
            ],
            tmp / f"{name}-{self.port}.log",
        )

    def wait_ready(self, timeout_s: float = STARTUP_TIMEOUT_S) -> Self:
        import tritonclient.grpc as triton

        client = triton.InferenceServerClient(self.address)
        self.wait_until(lambda: client.is_server_ready(client_timeout=1), timeout_s)
        client.close()
        return self

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics").text


class Gateway(ServerProcess):
    def __init__(self, tmp: Path, workers: str, *extra: str, env: dict | None = None):
        self.http_port, self.grpc_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        super().__init__(
            [
                "gateway",
                "--workers",
                workers,
                "--host",
                "127.0.0.1",
                "--http-port",
                str(self.http_port),
                "--grpc-port",
                str(self.grpc_port),
                "--drain-timeout-s",
                "5",
                "--health-interval-s",
                "0.3",
                *extra,
            ],
            tmp / f"gateway-{self.http_port}.log",
            env,
        )

    def wait_ready(self, timeout_s: float = STARTUP_TIMEOUT_S) -> Self:
        self.wait_until(lambda: httpx.get(f"{self.url}/health/ready", timeout=1).status_code == 200, timeout_s)
        return self


@contextlib.contextmanager
def served(tmp: Path, *worker_args: str) -> Iterator[Gateway]:
    """A worker started with `worker_args` and a gateway in front of it, both ready (the gateway starts while the
    worker loads and is ready once it admits it); stopped on exit."""
    worker = Worker(tmp, *worker_args).start()
    gw = Gateway(tmp, worker.address).start()
    try:
        worker.wait_ready()
        yield gw.wait_ready()
    finally:
        gw.terminate()
        worker.terminate()


@contextlib.asynccontextmanager
async def in_process_gateway(workers: str, what: str, client_timeout_s: float = 10.0):
    """The gateway app in this process over `workers`, once it has admitted them (`what` names them in the
    failure); yields (an HTTP client of it, its state)."""
    from service.gateway.app import GatewayState, create_app
    from service.gateway.settings import GatewaySettings

    state = GatewayState.build(GatewaySettings(workers=workers, grpc_port=-1, health_interval_s=0.05))
    await state.pool.start()
    try:
        deadline = time.monotonic() + 10
        while not state.dispatcher.ready:
            assert time.monotonic() < deadline, f"the gateway never admitted {what}"
            await asyncio.sleep(0.02)
        app = create_app(state=state)
        app.state.gateway = state  # what the lifespan sets; httpx's ASGI transport does not run it
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gateway", timeout=client_timeout_s
        ) as client:
            yield client, state
    finally:
        await state.pool.stop()


def metric_value(text: str, name: str, **labels) -> float:
    """Sum of the samples of `name` whose labels include `labels` (Prometheus text format)."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


@pytest.fixture(scope="module")
def stub_worker(tmp_path_factory):
    worker = Worker(tmp_path_factory.mktemp("worker"), "--stub-step-ms", "1").start()
    try:
        yield worker.wait_ready()
    finally:
        worker.terminate()


@pytest.fixture(scope="module")
def gateway(stub_worker, tmp_path_factory):
    gw = Gateway(tmp_path_factory.mktemp("gateway"), stub_worker.address).start()
    try:
        yield gw.wait_ready()
    finally:
        gw.terminate()


def gateway_of(config: ServiceConfig) -> GatewaySettings:
    """The gateway settings `parse_config` built for a command that runs a gateway."""
    from service.gateway.settings import GatewaySettings

    assert isinstance(config.gateway, GatewaySettings), f"the {config.command} command runs no gateway"
    return config.gateway


def worker_of(config: ServiceConfig) -> WorkerSettings:
    """The worker settings `parse_config` built for a command that runs a worker."""
    from service.worker.settings import WorkerSettings

    assert isinstance(config.worker, WorkerSettings), f"the {config.command} command runs no worker"
    return config.worker


def output(result: triton.InferResult | None, name: str) -> np.ndarray:
    """Output `name` of a tritonclient answer, failing where there is no answer or it lacks that output."""
    assert result is not None, "no answer"
    array = result.as_numpy(name)
    assert array is not None, f"the answer has no {name!r} output"
    return array


def picked(pool: WorkerPool, model: str, **options) -> str:
    """The address of the worker `pool.pick` chose, failing where it chose none."""
    endpoint = pool.pick(model, **options)
    assert endpoint is not None, f"no worker picked for {model!r} ({options})"
    return endpoint.address
