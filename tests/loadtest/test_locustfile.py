"""The Locust file runs headless against the fake server and reports both endpoints and TTFT."""

import csv
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.fake_server import FakeServerConfig

REPO = Path(__file__).resolve().parents[2]


def test_locustfile_compiles():
    compile((REPO / "loadtest" / "locustfile.py").read_text(), "locustfile.py", "exec")


def test_headless_run_against_the_fake_server(fake_server_thread, tmp_path):
    # find_spec, not import: importing locust monkey-patches the pytest process with gevent (and can deadlock it)
    if importlib.util.find_spec("locust") is None:
        pytest.skip("Locust is optional: pip install locust")
    with fake_server_thread(FakeServerConfig(ttft_s=0.01, itl_s=0.001)) as srv:
        env = dict(os.environ, PYTHONPATH=str(REPO), LOADTEST_MAX_TOKENS="8")
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "locust",
                "-f",
                "loadtest/locustfile.py",
                "--host",
                srv.url,
                "--headless",
                "-u",
                "4",
                "-r",
                "4",
                "-t",
                "3s",
                "--stop-timeout",
                "5",
                "--csv",
                str(tmp_path / "run"),
                "--only-summary",
                "ChatUser",
                "CompletionsUser",
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {(r["Type"], r["Name"]): r for r in csv.DictReader((tmp_path / "run_stats.csv").open())}
    for key in [("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("TTFT", "/v1/chat/completions")]:
        assert int(rows[key]["Request Count"]) > 0, key
        assert int(rows[key]["Failure Count"]) == 0, key
