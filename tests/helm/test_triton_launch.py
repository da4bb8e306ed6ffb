"""Tensor parallelism on the Triton runtime: the chart starts one tritonserver per rank under mpirun, each in
TensorRT-LLM's LLM-API mode, as NVIDIA/TensorRT-LLM triton_backend/scripts/launch_triton_server.py get_cmd does with
--trtllm_llmapi_launch and --world_size N: `-n 1 trtllm-llmapi-launch tritonserver --model-repository=...` per rank,
ranks separated by `:`, ranks > 0 with `--model-control-mode=explicit --load-model=tensorrt_llm`, every rank with
`--disable-auto-complete-config` and its own `--backend-config=python,shm-region-prefix-name=prefix<rank>_`. The
model's side of it (rank 0 builds the LLM over MPI, the others wait) is tested in tests/export/test_triton_model.py."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time

import pytest

from tests.helm.conftest import VALUE_SETS, container, render, workload


def _ranks(args: list[str]) -> list[list[str]]:
    ranks, current = [], []
    for arg in args:
        if arg == ":":
            ranks.append(current)
            current = []
        else:
            current.append(arg)
    return ranks + [current]


def _worker(values: str) -> dict:
    return container(workload(render(VALUE_SETS[values]), "worker")["spec"]["template"]["spec"], "worker")


def test_each_rank_runs_tritonserver_through_trtllm_llmapi_launch():
    worker = _worker("prod-triton-pvc")
    assert worker["command"][:2] == ["sh", "-c"] and 'mpirun "$@" &' in worker["command"][2]
    ranks = _ranks(worker["args"])
    assert len(ranks) == 2  # tensorParallel 2
    for rank, args in enumerate(ranks):
        assert args[:4] == ["-n", "1", "trtllm-llmapi-launch", "tritonserver"]
        assert "--model-repository=$(DEEPSPEC_TRITON_MODEL_REPOSITORY)" in args
        assert "--disable-auto-complete-config" in args
        assert f"--backend-config=python,shm-region-prefix-name=prefix{rank}_" in args
        assert ("--load-model=tensorrt_llm" in args) == (rank > 0)


def test_one_rank_runs_tritonserver_alone():
    worker = _worker("triton-pvc")
    assert worker["command"] == ["tritonserver"] and "trtllm-llmapi-launch" not in worker["args"]


@pytest.mark.parametrize("values", ["triton-pvc", "prod-triton-pvc"])
def test_the_triton_pod_names_its_user_like_the_other_runtimes(values):
    """UID 10001 has no passwd entry in the Triton image: Python's getpass.getuser() (torch's and Triton's cache
    directories) raises without USER/LOGNAME, which the engine runtimes already set."""
    env = {e["name"]: e.get("value") for e in _worker(values)["env"]}
    assert env["USER"] == env["LOGNAME"] == "deepspec"


#: stand-ins: `mpirun` runs each `:`-separated rank's command (dropping `-n 1` and trtllm-llmapi-launch) and exits
#: when they all have; `tritonserver` logs its start, then on SIGTERM logs its drain after a moment and exits. Only
#: PID 1 is signalled, as the kubelet does.
_FAKE_MPIRUN = """\
    #!/bin/sh
    rank=""
    for arg in "$@"; do
      if [ "$arg" = ":" ]; then sh -c "$rank" & rank=""; continue; fi
      case "$arg" in -n|1|trtllm-llmapi-launch) continue;; esac
      rank="$rank '$arg'"
    done
    sh -c "$rank" &
    wait
"""
_FAKE_TRITONSERVER = """\
    #!/bin/sh
    me="$*"
    trap 'sleep 0.3; echo "drained $me" >> "$LOG"; exit 0' TERM
    echo "started $me" >> "$LOG"
    while :; do sleep 0.1; done
"""


def _write(path, text):
    path.write_text(textwrap.dedent(text))
    path.chmod(0o755)


def test_sigterm_reaches_every_rank_rank_0_first_and_the_pod_exits_after_the_drain(tmp_path):
    """The rendered PID 1 of a TP=2 Triton pod, run with stand-ins for mpirun and tritonserver: SIGTERM to it (what
    the kubelet sends) drains rank 0, then the follower, and the script exits 0 once mpirun has."""
    worker = _worker("prod-triton-pvc")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _write(bin_dir / "mpirun", _FAKE_MPIRUN)
    _write(bin_dir / "tritonserver", _FAKE_TRITONSERVER)
    log = tmp_path / "log"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "LOG": str(log),
        "DEEPSPEC_TRITON_MODEL_REPOSITORY": "/repo",
    }
    args = [a.replace("$(DEEPSPEC_TRITON_MODEL_REPOSITORY)", "/repo") for a in worker["args"]]
    pid1 = subprocess.Popen([*worker["command"], *args], env=env, start_new_session=True)
    try:
        for _ in range(100):
            if log.exists() and log.read_text().count("started") == 2:
                break
            time.sleep(0.05)
        assert log.read_text().count("started") == 2
        pid1.send_signal(signal.SIGTERM)
        assert pid1.wait(timeout=15) == 0
    finally:
        if pid1.poll() is None:
            os.killpg(pid1.pid, signal.SIGKILL)
    drained = [line for line in log.read_text().splitlines() if line.startswith("drained")]
    assert len(drained) == 2
    assert "prefix0_" in drained[0] and "--load-model=tensorrt_llm" in drained[1]
