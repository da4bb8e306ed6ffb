"""prepare: prompt parsing, resumability, failure side file, and the OpenAI-endpoint backend against a fake
server (no network)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import cast

import pytest

from training.__main__ import main
from training.prepare import Generate, PrepareStats, read_prompts, regenerate


def _prompts(path, n=4):
    lines = [json.dumps({"turns": [f"q{i}"]}) for i in range(n)] + ["{broken", json.dumps({"turns": []})]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_malformed_prompts_are_counted(tmp_path):
    stats = PrepareStats()
    rows = read_prompts([_prompts(tmp_path / "p.jsonl")], None, 0, stats)
    assert [r.id for r in rows] == [f"p:{i}" for i in range(1, 5)] and stats.num_malformed == 2
    with pytest.raises(FileNotFoundError):
        read_prompts([tmp_path / "missing.jsonl"], None, 0, stats)


def test_resumable_and_failures_logged(tmp_path):
    rows = read_prompts([_prompts(tmp_path / "p.jsonl")], None, 0, PrepareStats())
    calls = []

    def flaky(batch):
        calls.append(len(batch))
        return [
            RuntimeError("boom") if m[-1]["content"] == "q2" else (f"answer to {m[-1]['content']}", 3) for m in batch
        ]

    out = tmp_path / "out.jsonl"
    # regenerate takes an Exception in a batch's results as that row's failure, which Generate's type leaves out
    stats = regenerate(rows, cast(Generate, flaky), out, 2, PrepareStats())
    assert stats.num_done == 3 and stats.num_failed == 1
    assert "boom" in (tmp_path / "out.jsonl.failures.jsonl").read_text()
    stats = regenerate(rows, lambda b: [("ok", 1)] * len(b), out, 2, PrepareStats())
    assert stats.num_skipped == 3 and stats.num_done == 1  # only the failed row is redone
    convs = [json.loads(line)["conversations"] for line in out.read_text().splitlines()]
    assert all(c[-1]["role"] == "assistant" for c in convs) and len(convs) == 4


class _FakeOpenAI(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text = "echo: " + body["messages"][-1]["content"]
        payload = json.dumps(
            {"choices": [{"message": {"role": "assistant", "content": text}}], "usage": {"completion_tokens": 2}}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


def test_cli_with_endpoint(tmp_path, capsys):
    server = HTTPServer(("127.0.0.1", 0), _FakeOpenAI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out = tmp_path / "regen.jsonl"
        args = [
            "prepare",
            "--inputs",
            str(_prompts(tmp_path / "p.jsonl")),
            "--out",
            str(out),
            "--endpoint",
            f"http://127.0.0.1:{server.server_port}",
            "--batch-size",
            "2",
        ]
        assert main(args) == 0
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert rows[0]["conversations"][1]["content"] == "echo: q0"
        assert main(args) == 0  # resumable: nothing left to do
        assert '"skipped_finished": 4' in capsys.readouterr().out
    finally:
        server.shutdown()


def test_engine_backend_matches_target_greedy(tmp_path):
    """The engine backend: continuous batching across rows, answers = the target's own greedy output."""
    from deepspec.decoding.engine import SpecEngine
    from deepspec.decoding.params import SamplingParams
    from deepspec.models import load_target
    from tests.training.helpers import tiny_hf_target_dir
    from training.prepare import stream_regenerate

    target = load_target(str(tiny_hf_target_dir(tmp_path / "target")))
    rows = read_prompts([_prompts(tmp_path / "p.jsonl", n=3)], None, 0, PrepareStats())
    out = tmp_path / "out.jsonl"
    params = SamplingParams(max_tokens=6)
    stream_regenerate(rows, target, params, out, PrepareStats(), batch_size=2)
    got = [json.loads(line)["conversations"][1]["content"] for line in out.read_text().splitlines()]
    engine = SpecEngine(target, None, max_batch_size=1, max_seq_len=256)
    want = [
        engine.generate([target.encode_chat([{"role": "user", "content": f"q{i}"}])], SamplingParams(max_tokens=6))[
            0
        ].text
        for i in range(3)
    ]
    assert got == want

    # a conversation longer than the engine's window is logged as a failure, not lost silently
    stats = PrepareStats()
    short = tmp_path / "short.jsonl"
    stream_regenerate(rows, target, params, short, stats, batch_size=2, max_seq_len=8)
    assert stats.num_failed == 3
    assert not short.exists() or short.read_text() == ""
    failures = (tmp_path / "short.jsonl.failures.jsonl").read_text()
    assert "maximum context length is 8 tokens" in failures


def test_cli_native_backend(tmp_path, capsys):
    """`prepare --backend native` answers on the native decoder and says so in its summary (with tokens/s)."""
    from deepspec.models.native import NativeUnavailable
    from deepspec.models.native.build import load_library
    from tests.training.helpers import tiny_hf_target_dir

    try:
        load_library()
    except NativeUnavailable as exc:
        pytest.skip(f"no native decoder here: {exc}")
    out = tmp_path / "regen.jsonl"
    args = [
        "prepare",
        "--inputs",
        str(_prompts(tmp_path / "p.jsonl", n=3)),
        "--out",
        str(out),
        "--target",
        str(tiny_hf_target_dir(tmp_path / "target")),
        "--backend",
        "native",
        "--threads",
        "1",
        "--max-tokens",
        "4",
        "--max-seq-len",
        "64",
    ]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["backend"].startswith("native") and summary["done"] == 3 and summary["tokens_per_second"] > 0
    assert all(json.loads(line)["answer_tokens"] >= 1 for line in out.read_text().splitlines())
