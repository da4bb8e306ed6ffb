"""bench/service_common.py: a benchmark stopped with SIGTERM stops the servers it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

BENCH = """
import sys, time
sys.path.insert(0, {repo!r})
from pathlib import Path
from bench import service_common
service_common.RESULTS = Path({logs!r})
proc = service_common.Proc([sys.executable, "-c", "import time; time.sleep(120)"], "test-sigterm-child")
print(proc.proc.pid, flush=True)
try:
    time.sleep(120)
finally:
    proc.stop()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (exited, not reaped yet) is not running
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_sigterm_to_a_benchmark_stops_its_servers(tmp_path):
    bench = subprocess.Popen(
        [sys.executable, "-c", BENCH.format(repo=str(REPO), logs=str(tmp_path))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert bench.stdout is not None and bench.stderr is not None  # both piped above
    child = int(bench.stdout.readline())
    try:
        assert _alive(child)
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(30) == 128 + signal.SIGTERM, bench.stderr.read()
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), "the server outlived the benchmark that started it"
    finally:
        for pid in (child, bench.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_cpu_seconds_reads_a_processs_run_time_and_none_for_one_that_is_gone():
    from bench.service_common import cpu_seconds

    first = cpu_seconds(os.getpid())
    assert first is not None and first > 0
    sum(range(2_000_000))  # some CPU work of this process
    second = cpu_seconds(os.getpid())
    assert second is not None and second > first
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    assert cpu_seconds(finished.pid) is None
