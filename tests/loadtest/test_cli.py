"""`python -m loadtest` end to end against the fake server: reports, sweeps, plots, compare, usage errors, Ctrl-C."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadtest.cli import main
from loadtest.fake_server import FakeServerConfig
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
RANDOM = ["--dataset-name", "random", "--random-input-len", "8", "--random-output-len", "6", "--quiet"]


def test_help_is_instant_and_defines_the_metrics():
    t = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "loadtest", "--help"], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert time.perf_counter() - t < 5
    for needle in (
        "(e2e - TTFT) / (output tokens - 1)",
        "goodput",
        "acceptance length",
        "requests/s",
        "python -m loadtest --compare",
    ):
        assert needle in out.stdout
    # --help must not pull in the heavy libraries
    probe = (
        "import sys; from loadtest.cli import build_parser; build_parser(); "
        "print(sorted({'aiohttp','grpc','matplotlib','numpy'} & set(sys.modules)))"
    )
    assert (
        subprocess.run(
            [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        == "[]"
    )


def test_run_writes_a_report_with_spec_decode_and_goodput(fake_server_thread, tmp_path, capsys):
    with fake_server_thread(FakeServerConfig(ttft_s=0.01, itl_s=0.002, tokens_per_chunk=2)) as srv:
        rc = main(
            [
                "--base-url",
                srv.url,
                *RANDOM,
                "--backend",
                "openai",
                "--max-concurrency",
                "4",
                "--num-prompts",
                "20",
                "--num-warmups",
                "4",
                "--slo",
                "ttft=1000,tpot=1000",
                "--result-file",
                str(tmp_path / "r.json"),
                "--plot",
                str(tmp_path / "plots"),
                "--label",
                "draft",
            ]
        )
    assert rc == 0
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["completed"] == 20 and rep["failed"] == 0 and rep["model_id"] == "fake-model" and rep["label"] == "draft"
    assert rep["request_goodput"] == pytest.approx(rep["request_throughput"])
    assert rep["spec_decode"]["acceptance_length"] == pytest.approx(2.0)
    assert rep["arrival"] == "closed-loop" and rep["max_concurrency"] == 4 and rep["num_warmups"] == 4
    assert (tmp_path / "plots" / "latency_cdf.png").exists()
    out = capsys.readouterr().out
    assert "Serving Benchmark Result" in out and "report:" in out


def test_sweep_and_compare(fake_server_thread, tmp_path, capsys):
    with fake_server_thread(FakeServerConfig(ttft_s=0.005)) as srv:
        for name in ("a", "b"):
            rc = main(
                [
                    "--base-url",
                    srv.url,
                    *RANDOM,
                    "--max-concurrency",
                    "1,4",
                    "--num-prompts",
                    "8",
                    "--result-file",
                    str(tmp_path / f"{name}.json"),
                    "--plot",
                    str(tmp_path / "p"),
                ]
            )
            assert rc == 0
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["sweep_over"] == "max_concurrency" and [r["max_concurrency"] for r in doc["runs"]] == [1, 4]
    assert (tmp_path / "p" / "throughput_vs_load.png").exists()
    assert "Sweep over max_concurrency:" in capsys.readouterr().out
    assert main(["--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    assert "B/A" in out and "request throughput" in out
    assert main(["--compare", str(tmp_path / "a.json"), str(tmp_path / "missing.json")]) == 2


def test_server_down_counts_errors_and_exits_1(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    rc = main(
        [
            "--base-url",
            url,
            "--model",
            "m",
            *RANDOM,
            "--max-concurrency",
            "2",
            "--num-prompts",
            "5",
            "--result-file",
            str(tmp_path / "r.json"),
        ]
    )
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rc == 1 and rep["failed"] == 5 and rep["errors_by_kind"] == {"connect": 5}
    assert rep["spec_decode"] is None and "scrape" in rep["spec_decode_note"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--slo", "ttfb=3"],
        ["--request-rate", "1,2", "--max-concurrency", "1,2"],
        ["--request-rate", "0"],
        ["--max-concurrency", "0"],
        ["--dataset-path", "/nonexistent/dir"],
        ["--fake-server", "nonsense"],
    ],
)
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--plan", *argv])
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_plan_sends_nothing(capsys):
    assert main(["--plan", *RANDOM, "--request-rate", "1,2", "--burstiness", "0.5", "--duration", "10"]) == 0
    out = capsys.readouterr().out
    assert "gamma: rate 1 req/s, burstiness 0.5" in out and "10 s" in out


def test_ctrl_c_writes_a_partial_report(tmp_path):
    """Two real processes: the fake server, and the load tester, which gets SIGINT mid-run."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "loadtest",
            "--fake-server",
            f"127.0.0.1:{port}",
            "--fake-ttft-ms",
            "50",
            "--fake-itl-ms",
            "20",
        ],
        cwd=REPO,
        env=env,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 30
        while _served_chunks(port) is None and time.time() < deadline:
            time.sleep(0.1)
        tester = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "loadtest",
                "--base-url",
                f"http://127.0.0.1:{port}",
                *RANDOM,
                "--max-concurrency",
                "4",
                "--num-prompts",
                "100000",
                "--result-file",
                str(tmp_path / "r.json"),
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        # interrupt only once requests are being answered (the server's counters move), however slow the start.
        deadline = time.time() + 30
        while (_served_chunks(port) or 0) < 100 and time.time() < deadline:
            time.sleep(0.1)
        tester.send_signal(signal.SIGINT)
        out, _ = tester.communicate(timeout=20)
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(10)
    assert tester.returncode == 130
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["interrupted"] and 0 < rep["completed"] < 100000 and rep["failed"] == 0 and rep["num_cancelled"] == 4
    assert "Interrupted" in out


def _served_chunks(port: int) -> float | None:
    """Chunks the fake server has streamed so far (its drafts counter); None while it is not up."""
    import urllib.request

    from loadtest.spec_stats import parse_counters

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
            return parse_counters(r.read().decode()).num_drafts
    except OSError:
        return None
