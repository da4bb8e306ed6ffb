"""When the end-to-end test runs, skips or fails (tests/e2e/conftest.py), checked with a stand-in `docker` CLI: these
run in `make test`, with or without Docker."""

from __future__ import annotations

import os
import stat

import pytest

from tests.e2e.conftest import skip_reason
from tests.e2e.docker_cli import DockerError, docker, unavailable_reason


@pytest.fixture
def fake_docker(tmp_path, monkeypatch):
    """Put a `docker` on PATH that prints `stderr` and exits with `code`."""

    def install(stderr: str, code: int) -> None:
        script = tmp_path / "docker"
        script.write_text(f"#!/bin/sh\necho '{stderr}' >&2\nexit {code}\n")
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}/usr/bin:/bin")

    return install


def test_not_asked_for_it_is_skipped_with_the_command_that_runs_it():
    reason = skip_reason({})
    assert reason is not None and "make e2e" in reason


def test_without_the_docker_cli_it_is_skipped_saying_so(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there
    assert skip_reason({"DEEPSPEC_E2E": "1"}) == "Docker is unavailable: the docker CLI is not installed"


def test_without_a_daemon_it_is_skipped_with_dockers_own_line(fake_docker):
    fake_docker("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?", 1)
    reason = skip_reason({"DEEPSPEC_E2E": "1"})
    assert reason is not None
    assert reason.startswith("Docker is unavailable: no Docker daemon answers: Cannot connect") and "\n" not in reason


def test_a_broken_docker_is_not_a_reason_to_skip(fake_docker):
    """A daemon that answers with another error must let the test run, and fail."""
    fake_docker("permission denied while trying to connect to the Docker daemon socket", 1)
    assert unavailable_reason() is None and skip_reason({"DEEPSPEC_E2E": "1"}) is None
    with pytest.raises(DockerError, match="permission denied"):
        docker("run", "image")


def test_a_working_docker_runs_it(fake_docker):
    fake_docker("", 0)
    assert skip_reason({"DEEPSPEC_E2E": "1"}) is None


def test_the_prometheus_dockerfile_passes_hadolint():
    """The stack's one image of its own (tests/e2e/prometheus.Dockerfile) meets the product images' lint bar."""
    import json
    import subprocess

    from tests.docker.test_dockerfiles import hadolint
    from tests.e2e.conftest import REPO

    dockerfile = REPO / "tests" / "e2e" / "prometheus.Dockerfile"
    result = subprocess.run(
        [hadolint(), "--no-color", "--format", "json", str(dockerfile)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and json.loads(result.stdout or "[]") == [], result.stdout
