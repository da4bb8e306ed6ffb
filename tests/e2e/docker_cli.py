"""The Docker CLI, called as a person would call it, with every failure raised with docker's own words.

Docker is *unavailable* when its CLI is not installed or no daemon answers: the end-to-end test is then skipped with
that one line. Any other failure (a daemon that answers but cannot run a container, a missing image) is an error:
a broken Docker must fail the test, never skip it."""

from __future__ import annotations

import shutil
import subprocess

#: what `docker info` prints when no daemon listens on the socket the CLI uses
_NO_DAEMON = ("Cannot connect to the Docker daemon", "Is the docker daemon running", "error during connect")


class DockerError(RuntimeError):
    """A docker command failed; the message holds the command and docker's stderr."""


def docker(*args: str, timeout: float = 120, check: bool = True) -> str:
    """`docker <args>`'s stdout, stripped; raises DockerError on a non-zero exit when `check`."""
    try:
        result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise DockerError(f"docker {' '.join(args)}: no answer in {timeout:.0f} s") from e
    if check and result.returncode != 0:
        raise DockerError(f"docker {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}")
    return result.stdout.strip()


def unavailable_reason() -> str | None:
    """Why Docker cannot be used on this machine (no CLI, no daemon), in one line; None when a daemon answers or when
    it fails some other way (the caller then goes on and fails loudly)."""
    if shutil.which("docker") is None:
        return "the docker CLI is not installed"
    result = subprocess.run(
        ["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=60
    )
    if result.returncode != 0 and any(marker in result.stderr for marker in _NO_DAEMON):
        first_line = result.stderr.strip().splitlines()[0]
        return f"no Docker daemon answers: {first_line}"
    return None


def image_exists(image: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", image], capture_output=True, timeout=60).returncode == 0


def container_logs(name: str, tail: int = 40) -> str:
    """The container's last `tail` lines, its stdout and stderr interleaved as it wrote them."""
    result = subprocess.run(
        ["docker", "logs", "--tail", str(tail), name],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=30,
    )
    return result.stdout.strip()
