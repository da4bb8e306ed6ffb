"""The DeepSpec stack as containers on a Docker network of its own, laid out as the chart lays it out in a cluster.

- Two CPU workers (the `worker-cpu` image's own command: the default target and draft) answer to one network alias,
  `deepspec-worker`, as the pods behind the chart's headless worker Service do: the gateway's
  `dns://deepspec-worker:8001` discovery sees both and follows them through restarts. They share a named volume
  at `/cache`, the chart's model-cache volume: the engine the first worker exports and measures on its first start
  (minutes) is the second's, and, kept between runs as a PersistentVolume outlives its pods, the next run's.
- The gateway (the `gateway` image), configured by flags and environment only.
- Prometheus (Debian's package, tests/e2e/prometheus.Dockerfile), scraping every container's metrics port under the
  job names the chart's ServiceMonitors give, with the chart's rendered rules.

Every published port is bound to 127.0.0.1: the test reaches the stack through loopback only, and the containers
reach each other inside the network the stack creates (and removes).
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.e2e.docker_cli import DockerError, container_logs, docker, image_exists

WORKER_ALIAS = "deepspec-worker"  # the chart's headless worker Service
GATEWAY_ALIAS = "deepspec-gateway"
GATEWAY_HTTP, GATEWAY_GRPC, METRICS, WORKER_GRPC, PROMETHEUS = 8000, 50051, 8002, 8001, 9090
#: how often Docker runs each image's HEALTHCHECK here (the images say 15 s, sized for a cluster's patience)
HEALTH_FLAGS = ("--health-interval=2s", "--health-timeout=5s", "--health-retries=2")


@dataclass(frozen=True)
class Images:
    gateway: str
    worker: str
    prometheus: str

    def missing(self) -> list[str]:
        return [image for image in (self.gateway, self.worker, self.prometheus) if not image_exists(image)]


class Stack:
    """Names, lifecycle and published ports of the stack's containers."""

    def __init__(
        self,
        images: Images,
        workdir: Path,
        api_key: str,
        worker_args: list[str] | None = None,
        cache_volume: str = "deepspec-e2e-model-cache",
        prefix: str | None = None,
    ):
        self.images, self.workdir, self.api_key = images, workdir, api_key
        self.worker_args = list(worker_args or ())  # empty: the image's own command
        self.prefix = prefix or f"deepspec-e2e-{os.getpid()}"
        self.network, self.cache_volume = self.prefix, cache_volume
        self.workers = (f"{self.prefix}-worker-a", f"{self.prefix}-worker-b")
        self.gateway = f"{self.prefix}-gateway"
        self.prometheus = f"{self.prefix}-prometheus"

    @property
    def containers(self) -> tuple[str, ...]:
        return (*self.workers, self.gateway, self.prometheus)

    # --- lifecycle -------------------------------------------------------------------------------------------------

    def start(self, prometheus_config: dict, rules: dict, worker_timeout_s: float) -> None:
        """Network, workers one after the other (the second reuses the engine the first exported), gateway,
        Prometheus; returns once every one is ready."""
        docker("network", "create", self.network)
        docker("volume", "create", self.cache_volume)  # a no-op when a run before made it
        for worker in self.workers:
            self._run(
                worker,
                self.images.worker,
                *self.worker_args,
                aliases=(WORKER_ALIAS,),
                ports=(METRICS,),
                extra=(*HEALTH_FLAGS, "--health-start-period=900s", "-v", f"{self.cache_volume}:/cache"),
            )
            self.wait_healthy(worker, worker_timeout_s)
        self._run(
            self.gateway,
            self.images.gateway,
            "gateway",
            "--workers",
            f"dns://{WORKER_ALIAS}:{WORKER_GRPC}",
            "--http-port",
            str(GATEWAY_HTTP),
            "--grpc-port",
            str(GATEWAY_GRPC),
            "--metrics-port",
            str(METRICS),
            "--health-interval-s",
            "0.5",
            aliases=(GATEWAY_ALIAS,),
            ports=(GATEWAY_HTTP, METRICS),
            env={"DEEPSPEC_API_KEYS": self.api_key, "DEEPSPEC_GATEWAY_DNS_REFRESH_S": "1"},
            extra=(*HEALTH_FLAGS, "--health-start-period=60s"),
        )
        self.wait_http(f"{self.gateway_url}/health/ready", self.gateway, 120)
        config_dir = self.workdir / "prometheus"
        config_dir.mkdir(parents=True, exist_ok=True)
        (config_dir / "prometheus.yml").write_text(yaml.safe_dump(prometheus_config, sort_keys=False))
        (config_dir / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
        for path in (config_dir, *config_dir.iterdir()):  # readable by the image's `prometheus` user
            path.chmod(0o755 if path.is_dir() else 0o644)
        self._run(
            self.prometheus,
            self.images.prometheus,
            "--config.file=/etc/e2e/prometheus.yml",
            "--storage.tsdb.path=/tmp/data",
            f"--web.listen-address=:{PROMETHEUS}",
            "--log.level=warn",
            ports=(PROMETHEUS,),
            extra=("-v", f"{config_dir}:/etc/e2e:ro"),
        )
        self.wait_http(f"{self.prometheus_url}/-/ready", self.prometheus, 60)

    def close(self) -> None:
        """Remove every container and the network, whatever state they are in (the cache volume stays)."""
        for name in self.containers:
            docker("rm", "-f", "-v", name, check=False)
        docker("network", "rm", self.network, check=False)

    def _run(self, name: str, image: str, *command: str, aliases=(), ports=(), env=None, extra=()) -> None:
        args = ["run", "-d", "--name", name, "--network", self.network]
        args += [f"--network-alias={alias}" for alias in aliases]
        args += [f"--publish=127.0.0.1::{port}" for port in ports]
        args += [f"--env={key}={value}" for key, value in (env or {}).items()]
        docker(*args, *extra, image, *command)

    # --- faults ----------------------------------------------------------------------------------------------------

    def kill(self, name: str) -> None:
        """SIGKILL: the container dies at once, as a node loss or an OOM kill leaves a pod."""
        docker("kill", name)

    def stop(self, name: str, grace_s: int) -> None:
        """SIGTERM, then SIGKILL after `grace_s`: what Kubernetes does to a pod in a rolling update."""
        docker("stop", "-t", str(grace_s), name, timeout=grace_s + 60)

    def restart_after_stop(self, name: str, timeout_s: float) -> None:
        docker("start", name)
        self.wait_healthy(name, timeout_s)

    # --- observation -----------------------------------------------------------------------------------------------

    def published(self, name: str, port: int) -> int:
        """The loopback port Docker published `port` of `name` on (it may change when a container restarts)."""
        address = docker("port", name, f"{port}/tcp").splitlines()[0]
        return int(address.rpartition(":")[2])

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.published(self.gateway, GATEWAY_HTTP)}"

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.published(self.prometheus, PROMETHEUS)}"

    def metrics_url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.published(name, METRICS)}/metrics"

    def state(self, name: str) -> dict:
        return json.loads(docker("inspect", "--format", "{{json .State}}", name))

    def wait_healthy(self, name: str, timeout_s: float) -> None:
        """Until Docker's HEALTHCHECK passes."""
        self._wait(name, lambda state: state.get("Health", {}).get("Status") == "healthy", timeout_s, "healthy")

    def wait_http(self, url: str, name: str, timeout_s: float) -> None:
        """Until `url` answers 200."""

        def answers(_state) -> bool:
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    return response.status == 200
            except OSError:
                return False

        self._wait(name, answers, timeout_s, f"answering {url}")

    def _wait(self, name: str, ready, timeout_s: float, what: str) -> None:
        """Poll `ready(state)` while `name` runs; a container that exits or is not ready in time raises, with its
        log."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.state(name)
            if not state["Running"]:
                raise DockerError(f"{name} exited with {state['ExitCode']}:\n{self.logs(name)}")
            if ready(state):
                return
            time.sleep(0.5)
        raise DockerError(f"{name} not {what} after {timeout_s:.0f} s:\n{self.logs(name)}")

    def logs(self, name: str, tail: int = 40) -> str:
        return container_logs(name, tail)

    def diagnostics(self) -> str:
        """Every container's state and last log lines, for a failure message."""
        lines = []
        for name in self.containers:
            try:
                state = self.state(name)
                lines.append(f"--- {name}: {state['Status']} (exit {state['ExitCode']})\n{self.logs(name, 20)}")
            except DockerError as e:
                lines.append(f"--- {name}: {e}")
        return "\n".join(lines)
