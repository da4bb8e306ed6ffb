"""bench.service_throughput: a peer server that dies is reported as its row's status, not raised."""

import sys

import pytest

import bench.service_common
from bench.service_common import Proc
from bench.service_throughput import DATASET, peer_status


def test_a_peer_server_killed_by_sigill_reports_the_signal(tmp_path, monkeypatch):
    monkeypatch.setattr(bench.service_common, "RESULTS", tmp_path)  # the server's log goes here
    proc = Proc([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"], "sigill")
    with pytest.raises(RuntimeError, match="exited") as e:
        proc.wait_http("http://127.0.0.1:9/never", timeout_s=60)
    proc.stop()
    assert peer_status(proc, e.value) == "crashed: signal 4 (SIGILL)"


def test_the_workload_ships_with_the_repository():
    assert DATASET.is_file() and DATASET.parent.parent.name == "datasets"
