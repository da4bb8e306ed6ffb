"""Is the load tester the bottleneck? Its client-side overhead and CPU cost per streamed request.

    python -m bench.loadtest_overhead                 # ~1 min; prints a table
                                                      # (writes bench/results/loadtest_overhead.json)
    python -m bench.loadtest_overhead --quick         # one repeat, shorter runs (a smoke check)
    python -m bench.loadtest_overhead --no-pin --only "poisson 500"   # one scenario, OS-placed processes

Setup: the fake OpenAI server (loadtest/fake_server.py, uvloop) runs in its own process pinned to CPU 1 and the
load tester in this process pinned to CPU 0, so "one core" is literal. Each request streams 16 tokens, one per SSE
chunk, with TTFT 20 ms and ITL 2 ms on the server side; the server records, per request, when it had parsed the
request and when it wrote the last byte (perf_counter is CLOCK_MONOTONIC, shared by both processes).

  overhead  = client-measured e2e - server handling time (parsed -> last byte written): everything the client
              side adds, i.e. building and sending the request, the loopback both ways and parsing the stream.
              An upper bound on the tool's own cost (the kernel's and the server's socket work is in it too).
  send      = server parsed the request - client timestamped it as sent.
  CPU/req   = this process' CPU time (user + sys) / requests: 1 / CPU/req is the most requests/s one core can drive.

Scenarios: Poisson arrivals at 500 and 800 req/s with aiohttp (the client `python -m loadtest` uses), a closed
loop of 64 against a zero-latency server (how fast can it go), and the same 500 req/s run with an httpx client
for comparison (why aiohttp). Medians over repeats; the machine's other load shows up as spread between repeats.
Target: >= 500 req/s sustained with p50 overhead <= 1 ms.

On a machine shared with other jobs, read "CPU stolen" first: it is the share of the run the client was ready but
had no CPU, and every latency column grows with it (niceness does not help where the kernel groups processes by
session). CPU/req is the column such load does not move.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from loadtest.arrivals import LoadPoint
from loadtest.clients.openai_http import OpenAIHttpClient
from loadtest.fake_server import FakeOpenAIServer, FakeServerConfig
from loadtest.metrics import percentile
from loadtest.records import RequestInput, RequestOutput
from loadtest.runner import run_load
from loadtest.workload import random_requests

OUT_JSON = REPO / "bench" / "results" / "loadtest_overhead.json"
OUTPUT_TOKENS = 16


PIN = True


def _pin(cpu: int) -> None:
    num_cpus = os.cpu_count() or 1
    if PIN and hasattr(os, "sched_setaffinity") and num_cpus > 1:
        os.sched_setaffinity(0, {cpu % num_cpus})


def _runqueue_wait_s() -> float:
    """Seconds this thread has spent runnable but waiting for a CPU (Linux schedstat; 0 elsewhere).

    On a shared machine this is the time other processes took from the client: it inflates the overhead numbers
    without being the tool's cost, so the table shows it beside them."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def _server_main(conn, ttft_s: float, itl_s: float) -> None:
    """Child process: serve until told to stop, answering 'timings' with the recorded per-request times."""
    import uvloop

    _pin(1)

    async def serve() -> None:
        srv = FakeOpenAIServer(FakeServerConfig(ttft_s=ttft_s, itl_s=itl_s, record_timings=True))
        await srv.start()
        conn.send(srv.port)
        loop = asyncio.get_running_loop()
        while True:
            cmd = await loop.run_in_executor(None, conn.recv)
            if cmd == "timings":
                conn.send(srv.timings)
                srv.timings = []
            else:
                break
        await srv.aclose()

    uvloop.run(serve())


class HttpxClient(OpenAIHttpClient):
    """The same request and SSE handling as the aiohttp client, on httpx: for the comparison row only."""

    async def start(self) -> None:
        import httpx

        limits = httpx.Limits(max_connections=self.pool_size or None, max_keepalive_connections=self.pool_size or None)
        self._httpx = httpx.AsyncClient(limits=limits, timeout=self.timeout_s)

    async def aclose(self) -> None:
        await self._httpx.aclose()

    async def send(self, req: RequestInput) -> RequestOutput:
        out = RequestOutput(prompt_tokens=req.prompt_len or 0)
        data = json.dumps(self.build_body(req)).encode()
        out.start_time = start = time.perf_counter()
        pieces, last, n = [], 0.0, 0
        try:
            async with self._httpx.stream("POST", self.url, content=data, headers=self.headers) as resp:
                async for line in resp.aiter_lines():
                    now = time.perf_counter()
                    if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    choices = chunk.get("choices")
                    if choices and choices[0].get("text"):
                        if n == 0:
                            out.ttft_s = now - start
                        else:
                            out.itl_s.append(now - last)
                        last, n = now, n + 1
                        pieces.append(choices[0]["text"])
                    if chunk.get("usage"):
                        out.output_tokens = chunk["usage"]["completion_tokens"]
        except Exception as e:
            out.error_kind, out.error = "client_error", repr(e)
            return out
        out.e2e_s = time.perf_counter() - start
        out.generated_text = "".join(pieces)
        out.success = True
        return out


async def _one_run(client_cls, url: str, point: LoadPoint, num_requests: int, seed: int) -> dict:
    client = client_cls(url, chat=False, model="fake-model", pool_size=point.max_concurrency or 0, timeout_s=60)
    await client.start()
    requests = random_requests(input_len=16, output_len=OUTPUT_TOKENS, range_ratio=0.0, seed=seed, ignore_eos=True)
    try:
        # warm-up: open the connections and fill aiohttp's and the kernel's caches.
        await run_load(client, requests, LoadPoint(max_concurrency=32), num_requests=200)
        cpu0, wait0 = time.process_time(), _runqueue_wait_s()
        run = await run_load(client, requests, point, num_requests=num_requests, seed=seed)
        cpu, wait = time.process_time() - cpu0, _runqueue_wait_s() - wait0
    finally:
        await client.aclose()
    return {"run": run, "cpu_s": cpu, "wait_s": wait}


def _measure(conn, client_cls, url, point, num_requests, seed) -> dict:
    import uvloop

    conn.send("timings")
    conn.recv()  # drop anything left from an earlier run
    res = uvloop.run(_one_run(client_cls, url, point, num_requests, seed))
    conn.send("timings")
    server = {t[0]: t[1:] for t in conn.recv()}
    run = res["run"]
    ok = [o for o in run.outputs if o.success]
    overhead, send, ttft_over = [], [], []
    for o in ok:
        t = server.get(o.generated_text.split(" ", 2)[1] if o.generated_text else "")
        if t is None:
            continue
        t_recv, t_first, t_last = t
        overhead.append(o.e2e_s - (t_last - t_recv))
        send.append(t_recv - o.start_time)
        ttft_over.append(o.ttft_s - (t_first - t_recv))

    def q(xs, p):  # milliseconds
        return percentile(xs, p) * 1000

    return {
        "offered_req_per_s": None if point.request_rate == float("inf") else point.request_rate,
        "max_concurrency": point.max_concurrency,
        "requests": len(run.outputs),
        "failed": len(run.outputs) - len(ok),
        "matched": len(overhead),
        "achieved_req_per_s": len(ok) / run.duration_s,
        "overhead_p50_ms": q(overhead, 50),
        "overhead_p99_ms": q(overhead, 99),
        "ttft_overhead_p50_ms": q(ttft_over, 50),
        "send_p50_ms": q(send, 50),
        "e2e_p50_ms": q([o.e2e_s for o in ok], 50),
        "cpu_per_request_us": res["cpu_s"] / max(1, len(run.outputs)) * 1e6,
        "client_cpu_utilization": res["cpu_s"] / run.duration_s,
        "client_runqueue_wait_fraction": res["wait_s"] / run.duration_s,
    }


SCENARIOS = (
    # name, client, server (ttft_s, itl_s), load point, requests at full length
    ("aiohttp poisson 500/s", OpenAIHttpClient, (0.020, 0.002), LoadPoint(500.0), 3000),
    ("aiohttp poisson 800/s", OpenAIHttpClient, (0.020, 0.002), LoadPoint(800.0), 4000),
    ("aiohttp closed loop 64, zero latency", OpenAIHttpClient, (0.0, 0.0), LoadPoint(max_concurrency=64), 4000),
    ("httpx poisson 500/s", HttpxClient, (0.020, 0.002), LoadPoint(500.0), 800),
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="runs per scenario; the table shows medians (default: 3)")
    p.add_argument("--quick", action="store_true", help="1 repeat, a quarter of the requests")
    p.add_argument(
        "--no-pin",
        action="store_true",
        help="let the OS place both processes (on a busy shared machine "
        "pinning makes other jobs' load land on the client's core)",
    )
    p.add_argument("--only", default=None, help="run only the scenarios whose name contains this, e.g. '500/s'")
    p.add_argument("--out", default=str(OUT_JSON), help="JSON results path (default: %(default)s)")
    args = p.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    global PIN
    PIN = not args.no_pin
    ctx = mp.get_context("spawn")
    rows = []
    for name, client_cls, (ttft_s, itl_s), point, n in SCENARIOS:
        if args.only and args.only not in name:
            continue
        n = n // 4 if args.quick else n
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_server_main, args=(child, ttft_s, itl_s), daemon=True)
        proc.start()
        try:
            port = parent.recv()
            _pin(0)
            runs = [_measure(parent, client_cls, f"http://127.0.0.1:{port}", point, n, seed) for seed in range(repeats)]
        finally:
            parent.send("stop")
            proc.join(10)
            if proc.is_alive():
                proc.kill()
        med = {
            k: statistics.median(r[k] for r in runs)
            for k in runs[0]
            if isinstance(runs[0][k], (int, float)) and runs[0][k] is not None
        }
        # the least disturbed repeat: on a shared machine noise only adds, so the minimum is the tool's own cost.
        best = min(runs, key=lambda r: r["overhead_p50_ms"])
        rows.append(
            {
                "scenario": name,
                **runs[0],
                **med,
                "best_overhead_p50_ms": best["overhead_p50_ms"],
                "best_achieved_req_per_s": best["achieved_req_per_s"],
                "repeats": runs,
            }
        )
        print(f"done: {name}", file=sys.stderr)

    cols = [
        ("scenario", "scenario", "{}"),
        ("achieved_req_per_s", "req/s", "{:.0f}"),
        ("overhead_p50_ms", "overhead p50 ms", "{:.3f}"),
        ("overhead_p99_ms", "p99 ms", "{:.3f}"),
        ("best_overhead_p50_ms", "best p50 ms", "{:.3f}"),
        ("ttft_overhead_p50_ms", "TTFT ovh p50 ms", "{:.3f}"),
        ("cpu_per_request_us", "CPU/req us", "{:.0f}"),
        ("client_cpu_utilization", "client CPU", "{:.0%}"),
        ("client_runqueue_wait_fraction", "CPU stolen", "{:.0%}"),
        ("failed", "failed", "{:.0f}"),
    ]
    widths = [max(len(h), *(len(f.format(r[k])) for r in rows)) for k, h, f in cols]
    where = "client pinned to 1 core, fake server to another" if PIN else "client (one thread) and fake server unpinned"
    print(
        f"{where}; {OUTPUT_TOKENS} streamed tokens/request; medians of {repeats}; "
        "CPU stolen = client runnable but waiting for a CPU taken by other processes"
    )
    print("  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, ((k, h, f), w) in enumerate(zip(cols, widths))))
    for r in rows:
        print(
            "  ".join(
                f.format(r[k]).ljust(w) if i == 0 else f.format(r[k]).rjust(w)
                for i, ((k, h, f), w) in enumerate(zip(cols, widths))
            )
        )
    head = rows[0]  # the first scenario run (Poisson 500/s unless --only), medians
    verdict = (
        head["achieved_req_per_s"] >= 0.95 * 500
        and head["overhead_p50_ms"] <= 1.0
        and head["client_cpu_utilization"] < 1.0
    )
    print(f"target (>= 500 req/s on one core, p50 overhead <= 1 ms): {'met' if verdict else 'NOT met'}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "cpu_count": os.cpu_count(),
                "pinned": PIN,
                "load_average_1m": os.getloadavg()[0],
                "output_tokens_per_request": OUTPUT_TOKENS,
                "target_met": verdict,
                "scenarios": rows,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
