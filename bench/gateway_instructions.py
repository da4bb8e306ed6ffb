"""The gateway's own work, counted in instructions: per whole completion and per streamed token, with the gateway
under valgrind's callgrind in front of an upstream that answers canned bytes (bench/canned_upstream.py).

On a shared machine the time a request takes moves with everyone else's load; the instructions the gateway executes
for it do not (a few percent between runs for whole completions; streams move more, with how many events each read
finds). So a change to the gateway's hot path is measured here, one change at a time, and its effect on time in
bench/openai_upstream.py.

    python -m bench.gateway_instructions                 # ~2 min: the working tree's gateway
    python -m bench.gateway_instructions --root ../base  # another checkout's gateway, for a before/after

Counting starts after a warm-up (callgrind_control -i on); each phase's count is one dump (a dump resets the counts).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client as http_client
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import httpx

from bench.openai_upstream import MAX_TOKENS, PROMPT, stream_round
from bench.service_common import RESULTS, Proc, free_port

CONCURRENCY = 32


class CountedGateway:
    """`python -m service gateway` of `root` under callgrind, instrumentation off until `count` switches it on."""

    def __init__(self, root: Path, upstream_url: str, out_dir: Path):
        self.port, self.out_dir = free_port(), out_dir
        self.log = open(out_dir / "gateway.log", "wb")  # noqa: SIM115 (the process writes it until stop() closes it)
        self.proc = subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={out_dir}/callgrind.%p",
                sys.executable,
                "-m",
                "service",
                "gateway",
                "--workers",
                "openai+" + upstream_url,
                "--host",
                "127.0.0.1",
                "--http-port",
                str(self.port),
                "--grpc-port",
                "-1",
                "--log-level",
                "WARNING",
                "--health-interval-s",
                "30",
            ],
            cwd=root,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the gateway exited:\n{(self.out_dir / 'gateway.log').read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/health/ready", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise TimeoutError(f"the gateway under valgrind was not ready after {timeout_s} s")

    def _control(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(self.proc.pid)], capture_output=True, check=True)

    def count(self, phase) -> int:
        """Instructions the gateway executed while `phase()` ran."""
        self._control("-i", "on")
        self._control("-z")
        phase()
        self._control("-d")
        time.sleep(1)
        dump = max(self.out_dir.glob(f"callgrind.{self.proc.pid}*"), key=lambda p: p.stat().st_mtime)
        total = re.search(r"^(?:summary|totals): (\d+)", dump.read_text(), re.M)
        if total is None:
            raise RuntimeError(f"{dump} holds no instruction total (callgrind's summary or totals line)")
        return int(total.group(1))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def whole_completions(url: str, num: int) -> None:
    host, port = url.removeprefix("http://").split(":")
    conn = http_client.HTTPConnection(host, int(port), timeout=120)
    payload = json.dumps({"model": "stub", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0})
    for _ in range(num):
        conn.request("POST", "/v1/completions", payload, {"content-type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200, response.read()
        response.read()


def stream_rounds(url: str, num: int) -> None:
    async def run():
        limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            for _ in range(num):
                await stream_round(client, url, "stub", CONCURRENCY, MAX_TOKENS)

    asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="checkout whose gateway runs (default this one)")
    parser.add_argument("--requests", type=int, default=100, help="whole completions counted (default 100)")
    parser.add_argument("--rounds", type=int, default=3, help=f"rounds of {CONCURRENCY} streams counted (default 3)")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind (with callgrind_control) is not installed: apt-get install valgrind", file=sys.stderr)
        return 1
    RESULTS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        upstream_port = free_port()
        upstream = Proc(
            [sys.executable, "-m", "bench.canned_upstream", "--port", str(upstream_port)], "canned-upstream"
        )
        upstream.wait_http(f"http://127.0.0.1:{upstream_port}/health", 60)  # before the gateway's first probe
        gateway = CountedGateway(args.root.resolve(), f"http://127.0.0.1:{upstream_port}", Path(tmp))
        try:
            gateway.wait_ready()
            whole_completions(gateway.url, 30)  # warm the code paths and connections before counting
            stream_rounds(gateway.url, 2)
            per_request = gateway.count(lambda: whole_completions(gateway.url, args.requests)) / args.requests
            num_tokens = args.rounds * CONCURRENCY * MAX_TOKENS
            per_token = gateway.count(lambda: stream_rounds(gateway.url, args.rounds)) / num_tokens
        finally:
            gateway.stop()
            upstream.stop()
    print(
        f"{args.root.resolve()}: {per_request / 1e6:.3f} M instructions per whole completion, "
        f"{per_token / 1e6:.4f} M per streamed token (c={CONCURRENCY})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
