"""The stack fixture, and when the end-to-end test runs.

It runs when asked (`make e2e`, or DEEPSPEC_E2E=1): it starts four containers and takes minutes, so `make test`
reports it as skipped, with the command that runs it. Asked to run where Docker is unavailable (no CLI, no daemon),
it is skipped with that one line; where Docker answers but anything else goes wrong (a missing image, a container
that will not start or turn healthy), it fails, with every container's log.

Environment (the Makefile's `e2e` target sets the images from IMAGE_PREFIX / IMAGE_TAG):
- DEEPSPEC_E2E_GATEWAY_IMAGE, DEEPSPEC_E2E_WORKER_IMAGE: the images `make images` built;
- DEEPSPEC_E2E_PROMETHEUS_IMAGE: built from tests/e2e/prometheus.Dockerfile on DEEPSPEC_E2E_BASE_IMAGE when absent;
- DEEPSPEC_E2E_WORKER_ARGS: the workers' command instead of the image's own (e.g. `worker --target stub`);
- DEEPSPEC_E2E_WORKER_TIMEOUT_S: how long a worker may take to turn healthy (a first start exports an engine);
- DEEPSPEC_E2E_CACHE_VOLUME: the workers' shared /cache volume, kept between runs (`docker volume rm` it to time a
  first start).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.e2e import monitoring
from tests.e2e.docker_cli import DockerError, docker, image_exists, unavailable_reason
from tests.e2e.stack import METRICS, PROMETHEUS, WORKER_ALIAS, Images, Stack

REPO = Path(__file__).resolve().parents[2]
API_KEY = "sk-e2e"
_VERSION = next(
    line.split('"')[1] for line in (REPO / "pyproject.toml").read_text().splitlines() if line.startswith("version = ")
)


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: starts the whole stack as Docker containers (make e2e)")


def skip_reason(environ: Mapping[str, str]) -> str | None:
    """Why the end-to-end test does not run here, or None when it must run (and pass or fail)."""
    if environ.get("DEEPSPEC_E2E") != "1":
        return "the container end-to-end test runs with `make e2e` (DEEPSPEC_E2E=1): minutes of Docker, not make test"
    reason = unavailable_reason()
    return f"Docker is unavailable: {reason}" if reason else None


def images(environ: Mapping[str, str]) -> Images:
    return Images(
        gateway=environ.get("DEEPSPEC_E2E_GATEWAY_IMAGE", f"ghcr.io/deepspec/gateway:{_VERSION}"),
        worker=environ.get("DEEPSPEC_E2E_WORKER_IMAGE", f"ghcr.io/deepspec/worker-cpu:{_VERSION}"),
        prometheus=environ.get("DEEPSPEC_E2E_PROMETHEUS_IMAGE", "deepspec-e2e/prometheus:bookworm"),
    )


def _build_prometheus_image(image: str, base: str) -> None:
    docker(
        "build",
        "--network",
        "host",
        "--build-arg",
        f"BASE_IMAGE={base}",
        "-t",
        image,
        "-f",
        str(REPO / "tests" / "e2e" / "prometheus.Dockerfile"),
        str(REPO / "tests" / "e2e"),
        timeout=900,
    )


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    reason = skip_reason(os.environ)
    if reason:
        pytest.skip(reason)
    wanted = images(os.environ)
    if not image_exists(wanted.prometheus):
        _build_prometheus_image(wanted.prometheus, os.environ.get("DEEPSPEC_E2E_BASE_IMAGE", "debian:bookworm-slim"))
    missing = wanted.missing()
    if missing:
        pytest.fail(f"images missing: {', '.join(missing)} (build them with `make images`, docker/README.md)")
    worker_args = shlex.split(os.environ.get("DEEPSPEC_E2E_WORKER_ARGS", ""))
    running = Stack(
        wanted,
        tmp_path_factory.mktemp("e2e"),
        API_KEY,
        worker_args=worker_args,
        cache_volume=os.environ.get("DEEPSPEC_E2E_CACHE_VOLUME", "deepspec-e2e-model-cache"),
    )
    try:
        running.start(
            monitoring.scrape_config(running.gateway, WORKER_ALIAS, METRICS, PROMETHEUS),
            monitoring.rules(),
            float(os.environ.get("DEEPSPEC_E2E_WORKER_TIMEOUT_S", "900")),
        )
    except DockerError as e:
        diagnostics = running.diagnostics()
        running.close()
        pytest.fail(f"the stack did not start: {e}\n{diagnostics}")
    yield running
    running.close()
