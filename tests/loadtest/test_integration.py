"""A few requests against the real embedded DeepSpec service.

Set DEEPSPEC_LOADTEST_URL (e.g. http://127.0.0.1:8000) to a running `python -m service`, and optionally
DEEPSPEC_LOADTEST_GRPC (e.g. 127.0.0.1:50051) for the gRPC API. Without them these tests skip.
"""

import json
import os

import pytest

from loadtest.cli import main

URL = os.environ.get("DEEPSPEC_LOADTEST_URL")
GRPC = os.environ.get("DEEPSPEC_LOADTEST_GRPC")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not URL, reason="set DEEPSPEC_LOADTEST_URL to a running DeepSpec service (python -m service)"),
]

COMMON = ["--num-prompts", "4", "--max-concurrency", "2", "--num-warmups", "1", "--max-tokens", "16", "--quiet",
          "--timeout", "300"]


@pytest.mark.parametrize("backend", ["openai", "openai-chat"])
def test_http_against_the_embedded_service(backend, tmp_path):
    rc = main(["--base-url", URL, "--backend", backend, *COMMON, "--result-file", str(tmp_path / "r.json")])
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rc == 0 and rep["completed"] == 4 and rep["failed"] == 0, rep["errors_by_kind"]
    assert rep["total_output_tokens"] > 0 and rep["mean_ttft_ms"] > 0
    if rep["spec_decode"] is not None:  # the embedded default ships a draft: acceptance length >= 1 by definition
        assert rep["spec_decode"]["acceptance_length"] is None or rep["spec_decode"]["acceptance_length"] >= 1.0


@pytest.mark.skipif(not GRPC, reason="set DEEPSPEC_LOADTEST_GRPC to the service's gRPC address (host:port)")
def test_grpc_against_the_embedded_service(tmp_path):
    rc = main(["--base-url", URL, "--backend", "grpc", "--grpc-address", GRPC, *COMMON, "--result-file", str(tmp_path / "r.json")])
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rc == 0 and rep["completed"] == 4 and rep["failed"] == 0, rep["errors_by_kind"]
