"""Helpers the service benchmarks share: start/stop server processes on free ports, tables.

Percentiles come from `loadtest.metrics.percentile`, the one the load-test report uses."""

from __future__ import annotations

import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exit_on_sigterm() -> None:
    """A benchmark stopped with SIGTERM (`kill`, `timeout`) unwinds as on Ctrl-C, so each `finally: proc.stop()`
    runs: Python's default SIGTERM action ends the process at once and leaves its servers running, decoding on the
    cores the next benchmark measures on."""
    import threading

    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


class Proc:
    """A server process; `wait_http` polls a URL until 200, failing with the log tail if the process dies."""

    def __init__(self, args: list[str], name: str, cpus: set[int] | None = None):
        """`cpus`: the CPUs the process (and its threads) may run on, None for any."""
        _exit_on_sigterm()
        self.args = args
        self.log_path = RESULTS / f"{name}.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115 (the process writes it until stop() closes it)
        pin = None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))
        self.proc = subprocess.Popen(
            args,
            cwd=REPO,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=pin,
        )

    def wait_until(self, check, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.proc.args} exited:\n{self.log_path.read_text()[-3000:]}")
            try:
                if check():
                    return
            except Exception:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"{self.proc.args} not ready after {timeout_s} s")

    def wait_http(self, url: str, timeout_s: float = 300) -> None:
        self.wait_until(lambda: httpx.get(url, timeout=2).status_code == 200, timeout_s)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


def cpu_seconds(pid: int) -> float | None:
    """CPU time a process's threads have run so far (Linux /proc schedstat, nanosecond counts), None where it is not
    readable: on a loaded machine a server's CPU per request is steady where its latency's tail is not."""
    try:
        tasks = Path(f"/proc/{pid}/task").iterdir()
        return sum(int((task / "schedstat").read_text().split()[0]) for task in tasks) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def service(*args: str, name: str, cpus: set[int] | None = None) -> Proc:
    return Proc([sys.executable, "-m", "service", *args], name, cpus)


def local_gateway(
    worker_ports: list[int] | list[str],
    http_port: int,
    *,
    name: str,
    env: dict[str, str] | None = None,
    extra: tuple[str, ...] = (),
    cpus: set[int] | None = None,
) -> Proc:
    """A gateway on 127.0.0.1:`http_port` (no gRPC port) over the workers at `worker_ports`, started with `env` (its
    DEEPSPEC_GATEWAY_* settings) added to this process's environment for the start only."""
    saved = {key: os.environ.get(key) for key in env or {}}
    os.environ.update(env or {})
    try:
        workers = ",".join(f"127.0.0.1:{port}" for port in worker_ports)
        return service(
            "gateway",
            "--workers",
            workers,
            "--host",
            "127.0.0.1",
            "--http-port",
            str(http_port),
            "--grpc-port",
            "-1",
            *extra,
            name=name,
            cpus=cpus,
        )
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def table(headers: list[str], rows: list[list]) -> str:
    cells = [[str(h) for h in headers]] + [[f"{c:.2f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


mean = statistics.fmean
