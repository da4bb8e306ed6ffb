"""A few requests against the real embedded DeepSpec service (`python -m service`, the default target and draft).

The service is started by the fixture on free ports; set DEEPSPEC_LOADTEST_URL (and DEEPSPEC_LOADTEST_GRPC) to
aim at one that is already running instead.
"""

import json
import os

import httpx
import pytest

from loadtest.cli import main
from tests.ports import free_port
from tests.service.conftest import ServerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """(HTTP base URL, gRPC address) of a running service."""
    if os.environ.get("DEEPSPEC_LOADTEST_URL"):
        yield os.environ["DEEPSPEC_LOADTEST_URL"], os.environ.get("DEEPSPEC_LOADTEST_GRPC")
        return
    http_port, grpc_port = free_port(), free_port()
    server = ServerProcess(
        [
            "embedded",
            "--host",
            "127.0.0.1",
            "--http-port",
            str(http_port),
            "--grpc-port",
            str(grpc_port),
            "--metrics-port",
            "-1",
        ],
        tmp_path_factory.mktemp("service") / "embedded.log",
    ).start()
    url = f"http://127.0.0.1:{http_port}"
    try:
        server.wait_until(lambda: httpx.get(f"{url}/health/ready", timeout=2).status_code == 200, 600)
        yield url, f"127.0.0.1:{grpc_port}"
    finally:
        server.terminate()


COMMON = [
    "--ignore-eos",
    "--num-prompts",
    "4",
    "--max-concurrency",
    "2",
    "--num-warmups",
    "1",
    "--max-tokens",
    "16",
    "--quiet",
    "--timeout",
    "300",
]


@pytest.mark.parametrize("backend", ["openai", "openai-chat"])
def test_http_against_the_embedded_service(service, backend, tmp_path):
    url, _ = service
    rc = main(["--base-url", url, "--backend", backend, *COMMON, "--result-file", str(tmp_path / "r.json")])
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rc == 0 and rep["completed"] == 4 and rep["failed"] == 0, rep["errors_by_kind"]
    assert rep["total_output_tokens"] > 0 and rep["mean_ttft_ms"] > 0
    if rep["spec_decode"] is not None:  # the embedded default ships a draft: acceptance length >= 1 by definition
        assert rep["spec_decode"]["acceptance_length"] is None or rep["spec_decode"]["acceptance_length"] >= 1.0


def test_grpc_against_the_embedded_service(service, tmp_path):
    url, grpc_address = service
    if grpc_address is None:
        pytest.skip("DEEPSPEC_LOADTEST_URL is set without DEEPSPEC_LOADTEST_GRPC")
    rc = main(
        [
            "--base-url",
            url,
            "--backend",
            "grpc",
            "--grpc-address",
            grpc_address,
            *COMMON,
            "--result-file",
            str(tmp_path / "r.json"),
        ]
    )
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rc == 0 and rep["completed"] == 4 and rep["failed"] == 0, rep["errors_by_kind"]
