"""bench.service_throughput: a peer server that dies is reported as its row's status, not raised."""

import re
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


def test_sampled_rows_are_compared_with_their_own_servers_greedy_row():
    from bench.service_throughput import SAMPLED_TARGET, row_name, sampled_vs_greedy

    assert row_name("deepspec-draft", 0.0, 0.9) == "deepspec-draft"
    assert row_name("deepspec-draft", 1.0, 1.0) == "deepspec-draft T=1"
    assert row_name("deepspec-draft", 0.7, 0.9) == "deepspec-draft T=0.7 top-p=0.9"
    servers = {
        "deepspec-draft": {"output_tok_per_s": 100.0},
        "deepspec-draft T=1": {"output_tok_per_s": 80.0},
        "deepspec-none": {"output_tok_per_s": 50.0},
        "deepspec-none T=1": {"output_tok_per_s": 45.0},
        "llama-cpp": {"output_tok_per_s": 40.0},
    }
    got = sampled_vs_greedy(servers, ["deepspec-draft", "deepspec-none", "llama-cpp"], [0.0, 1.0], 1.0)
    assert set(got) == {"deepspec-draft T=1", "deepspec-none T=1"}
    assert got["deepspec-draft T=1"] == {"greedy": "deepspec-draft", "ratio": 0.8, "target": SAMPLED_TARGET}
    assert got["deepspec-none T=1"]["ratio"] == pytest.approx(0.9)
    # without a greedy row there is nothing to compare with
    assert sampled_vs_greedy({"deepspec-draft T=1": {"output_tok_per_s": 1.0}}, ["deepspec-draft"], [1.0], 1.0) == {}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--temperature", "hot"], "--temperature takes a number"),
        (["--temperature", "-1"], r"--temperature must be in \[0, 2\]"),
        (["--top-p", "0"], r"--top-p must be in \(0, 1\]"),
    ],
)
def test_bad_sampling_arguments_exit_2_with_one_line(argv, message, capsys):
    from bench.service_throughput import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_the_report_puts_greedy_and_temperature_1_rows_side_by_side(tmp_path, monkeypatch, capsys):
    """The whole main() with the servers and the load stubbed: rows per (server, temperature), the ratio printed
    and written."""
    import json

    import bench.service_throughput as st

    class FakeProc:
        def wait_http(self, url, timeout_s):
            pass

        def stop(self):
            pass

    async def fake_load(url, model, prompts, temperature=0.0, top_p=1.0, concurrency=8):
        tokens = 80 if temperature > 0 else 100  # sampled: 0.8x of greedy over the same 1 s
        return [{"sent": 0.0, "done": 1.0, "ttft_s": 0.1, "tokens": tokens}]

    monkeypatch.setattr(st, "RESULTS", tmp_path)
    drafts = []

    def fake_start(kind, port, extra, draft="auto"):
        drafts.append((kind, draft))
        return FakeProc(), "m", "http://x"

    monkeypatch.setattr(st, "start", fake_start)
    monkeypatch.setattr(st, "run_load", fake_load)
    argv = ["--rounds", "2", "--only", "deepspec-draft", "--only", "llama-cpp", "--draft", "drafts/x"]
    assert st.main(argv) == 0
    assert ("deepspec-draft", "drafts/x") in drafts  # --draft reaches the draft server
    out = capsys.readouterr().out
    assert "deepspec-draft T=1 vs deepspec-draft: 0.80x of greedy tok/s (target >= 0.85x)" in out
    report = json.loads((tmp_path / "service_throughput.json").read_text())
    assert set(report["servers"]) == {"deepspec-draft", "deepspec-draft T=1", "llama-cpp"}  # the peer: greedy only
    assert report["servers"]["deepspec-draft T=1"]["rounds_tok_per_s"] == [80.0, 80.0]
    assert report["sampled_vs_greedy"]["deepspec-draft T=1"]["ratio"] == pytest.approx(0.8)
    assert report["speedup_vs_llama-cpp"] == pytest.approx(1.0)
