"""Service classes, fair shares and goodput routing under a batch flood: two stub workers behind one gateway.

    python -m bench.service_classes         # ~2 min; prints the table, writes bench/results/service_classes.json
    python -m bench.service_classes --flood-s 10     # shorter

Setup: two `--target stub` workers (`--stub-step-ms` per forward, `--max-batch-size` = cap + reserve) and a gateway
with three keys (service/gateway/service_classes.py): `sk-chat` interactive, `sk-bulk-1` batch weight 1 and
`sk-bulk-2` batch weight 2, `--max-inflight-per-worker` cap and `--interactive-reserve-per-worker` reserve (set as
DEEPSPEC_GATEWAY_* variables). Every request streams a completion and reads the usage chunk.

1. idle: the interactive client alone (closed loop, one request at a time): its TTFT p99 and TPOT p50.
2. capacity: batch clients in a closed loop, enough to fill every slot: completed requests per second.
3. flood: both batch keys open-loop (Poisson) at the capacity each, 2x capacity together, for `--flood-s`, while the
   interactive client runs as in 1. Reported: interactive TTFT p99 / idle p99 (target <= 2), TPOT p50 / idle p50
   (target within 10%), 5xx count (target 0), 429s by drop reason, each batch key's share of the tokens served
   against its weight's share (target within 10%) and Jain's fairness index of the weight-normalised token rates.
4. sessions: 8 chat sessions of 8 turns each (growing history, `x-session-id`) while one batch key keeps the pool
   busy at its capacity; the worker of each turn is read from the gateway's request log (the response id names the
   line). Target: >= 95% of a session's turns on one worker.
5. routing cost: sequential whole completions (no step delay) to a gateway scoring by goodput and to one using
   P2C over the same two workers (the two gateways alike in all else: keys, classes, cap, request log), and to a
   worker directly: added p50 / p99 (target: p99 added <= 2 ms with the scorer on), and each gateway's CPU time
   per request (its threads' run time, Linux), which runnable-queue waits on a loaded machine do not move.

Numbers come from the stub target: its step time does not grow with the batch, so TPOT isolates the gateway's and
the scheduler's doing; a real target's step grows with the batch, which the admission cap bounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import cast

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import httpx

from bench.service_common import RESULTS, Proc, cpu_seconds, free_port, local_gateway, service, table
from loadtest.metrics import percentile

KEYS = {
    "sk-chat": {"service_class": "interactive", "ttft_objective_s": 5.0},
    "sk-bulk-1": {"service_class": "batch", "weight": 1, "ttft_objective_s": 10.0},
    "sk-bulk-2": {"service_class": "batch", "weight": 2, "ttft_objective_s": 10.0},
}
PROMPT = "Write a short story about a lighthouse keeper."


def start(args, routing: str = "goodput", step_ms: float | None = None, tag: str = "") -> tuple[list[Proc], str]:
    """Two stub workers and a gateway over them; (processes, gateway URL)."""
    step_ms = args.step_ms if step_ms is None else step_ms
    ports = [free_port(), free_port()]
    workers = [
        service(
            "worker",
            "--target",
            "stub",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--metrics-port",
            "-1",
            "--stub-step-ms",
            str(step_ms),
            "--max-batch-size",
            str(args.cap + args.reserve),
            "--max-queue",
            "64",
            name=f"classes-worker{tag}-{i}",
        )
        for i, port in enumerate(ports)
    ]
    try:
        gateway, url = start_gateway(args, ports, routing, tag)
    except BaseException:
        for worker in workers:
            worker.stop()
        raise
    return [gateway, *workers], url


def start_gateway(args, worker_ports: list[int], routing: str, tag: str = "") -> tuple[Proc, str]:
    """A gateway over the workers at `worker_ports` with the benchmark's keys, classes and cap, routing by
    `routing`, once it is ready; (process, URL)."""
    http_port = free_port()
    env = {
        "DEEPSPEC_GATEWAY_SERVICE_CLASSES": json.dumps({"keys": KEYS}),
        "DEEPSPEC_GATEWAY_MAX_INFLIGHT_PER_WORKER": str(args.cap),
        "DEEPSPEC_GATEWAY_INTERACTIVE_RESERVE_PER_WORKER": str(args.reserve),
        "DEEPSPEC_GATEWAY_ROUTING": routing,
    }
    gateway = local_gateway(worker_ports, http_port, name=f"classes-gateway{tag}", env=env)
    url = f"http://127.0.0.1:{http_port}"
    try:
        gateway.wait_http(f"{url}/health/ready", 300)
    except BaseException:
        gateway.stop()
        raise
    return gateway, url


async def stream_one(
    client: httpx.AsyncClient,
    url: str,
    key: str,
    max_tokens: int,
    messages=None,
    session: str | None = None,
    extra: dict | None = None,
) -> dict:
    """One streamed request: status, TTFT, TPOT (s), tokens (prompt + completion), completion tokens and the
    response id. `extra`: more body fields (response_format, speculation, ...)."""
    body = {"max_tokens": max_tokens, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    path = "/v1/chat/completions" if messages else "/v1/completions"
    body.update({"messages": messages} if messages else {"prompt": PROMPT})
    body.update(extra or {})
    headers = {"authorization": f"Bearer {key}", **({"x-session-id": session} if session else {})}
    t0, first, last, usage, rid, text = time.perf_counter(), None, None, None, None, []
    async with client.stream("POST", url + path, json=body, headers=headers) as response:
        if response.status_code != 200:
            await response.aread()
            return {"status": response.status_code, "reason": response.headers.get("x-deepspec-drop-reason")}
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            rid = event.get("id", rid)
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", ()):
                piece = choice.get("text") or (choice.get("delta") or {}).get("content")
                if piece:
                    text.append(piece)
                    last = time.perf_counter()
                    first = first or last
    n = usage["completion_tokens"] if usage else 0
    return {
        "status": 200,
        "ttft": (first or t0) - t0,
        "tpot": (last - first) / (n - 1) if n > 1 and first is not None and last is not None else None,
        "tokens": usage["total_tokens"] if usage else 0,
        "completion_tokens": n,
        "id": rid,
        "text": "".join(text),
        "finished": time.perf_counter(),
    }


async def closed_loop(url: str, key: str, until: float, max_tokens: int, think_s: float = 0.0) -> list[dict]:
    results = []
    async with httpx.AsyncClient(timeout=120) as client:
        while time.perf_counter() < until:
            results.append(await stream_one(client, url, key, max_tokens))
            await asyncio.sleep(think_s)
    return results


async def open_loop(url: str, key: str, rate: float, until: float, max_tokens: int, seed: int) -> list[dict]:
    """Poisson arrivals at `rate` per second until `until`; every request's result."""
    rng, tasks = random.Random(seed), []
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=200)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        try:
            while time.perf_counter() < until:
                tasks.append(asyncio.ensure_future(stream_one(client, url, key, max_tokens)))
                await asyncio.sleep(rng.expovariate(rate))
            return list(await asyncio.gather(*tasks))
        finally:  # cancelled (a background load): its requests go with it
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def capacity(url: str, args) -> float:
    """Completed batch requests per second with every slot kept busy (closed loop)."""
    clients = 2 * 2 * args.cap
    t0 = time.perf_counter()
    until = t0 + args.capacity_s
    done = await asyncio.gather(*(closed_loop(url, "sk-bulk-1", until, args.max_tokens) for _ in range(clients)))
    return sum(r["status"] == 200 for rs in done for r in rs) / (time.perf_counter() - t0)


def latency(results: list[dict]) -> dict:
    ok = [r for r in results if r["status"] == 200]
    tpots = [r["tpot"] for r in ok if r["tpot"] is not None]
    return {
        "requests": len(results),
        "ok": len(ok),
        "ttft_p50_ms": percentile([r["ttft"] for r in ok], 50) * 1e3,
        "ttft_p99_ms": percentile([r["ttft"] for r in ok], 99) * 1e3,
        "tpot_p50_ms": percentile(tpots, 50) * 1e3 if tpots else None,
    }


def shares(per_key: dict[str, list[dict]], until: float) -> dict:
    """Each batch key's share of the tokens served by `until` (while both keys had requests waiting) against its
    weight's share; Jain's index over tokens/weight."""
    tokens = {
        k: sum(r["tokens"] for r in rs if r["status"] == 200 and r["finished"] <= until) for k, rs in per_key.items()
    }
    weights = {k: KEYS[k]["weight"] for k in per_key}
    total_tokens, total_weight = sum(tokens.values()) or 1, sum(weights.values())
    normalised = [tokens[k] / weights[k] for k in per_key]
    jain = sum(normalised) ** 2 / (len(normalised) * sum(x * x for x in normalised)) if any(normalised) else 0.0
    return {
        "keys": {
            k: {"tokens": tokens[k], "share": tokens[k] / total_tokens, "weight_share": weights[k] / total_weight}
            for k in per_key
        },
        "jain_index": jain,
    }


def statuses(results: list[dict]) -> dict:
    counts: dict[str, int] = {}
    for r in results:
        name = str(r["status"]) + (f" {r['reason']}" if r.get("reason") else "")
        counts[name] = counts.get(name, 0) + 1
    return counts


async def flood(url: str, args, rate: float) -> dict:
    """Both batch keys at `rate` requests/s each while the interactive client runs its closed loop."""
    until = time.perf_counter() + args.flood_s
    chat = asyncio.ensure_future(closed_loop(url, "sk-chat", until, args.max_tokens, think_s=0.05))
    bulk = await asyncio.gather(
        *(
            open_loop(url, key, rate, until, args.max_tokens, seed)
            for seed, key in enumerate(("sk-bulk-1", "sk-bulk-2"))
        )
    )
    interactive = await chat
    everything = interactive + bulk[0] + bulk[1]
    return {
        "interactive": latency(interactive),
        "statuses": statuses(everything),
        "num_5xx": sum(r["status"] >= 500 for r in everything),
        "fairness": shares({"sk-bulk-1": bulk[0], "sk-bulk-2": bulk[1]}, until),
    }


def workers_by_id(log_path: Path) -> dict[str, str]:
    """Response id -> the worker that served it, from the gateway's request log lines."""
    found = {}
    for line in log_path.read_text(errors="replace").splitlines():
        if '"event": "request"' in line:
            entry = json.loads(line)
            found[entry["id"]] = entry["worker"]
    return found


async def sessions(url: str, args, rate: float, log_path: Path) -> dict:
    """8 sessions x 8 turns (growing chat history, x-session-id) beside one batch key at `rate`."""
    until = time.perf_counter() + 3600
    background = asyncio.ensure_future(open_loop(url, "sk-bulk-1", rate, until, args.max_tokens, 7))

    async def conversation(i: int) -> list[str]:
        messages, ids = [], []
        async with httpx.AsyncClient(timeout=120) as client:
            for turn in range(8):
                messages.append({"role": "user", "content": f"Session {i}, question {turn}: tell me more."})
                result = await stream_one(client, url, "sk-chat", 16, messages=messages, session=f"s{i}")
                assert result["status"] == 200, result
                ids.append(result["id"])
                messages.append({"role": "assistant", "content": result["text"]})
        return ids

    try:
        conversations = await asyncio.gather(*(conversation(i) for i in range(8)))
    finally:
        background.cancel()
        await asyncio.gather(background, return_exceptions=True)
    await asyncio.sleep(0.5)  # the last log lines
    served = workers_by_id(log_path)
    on_main = [
        max(workers.count(w) for w in set(workers))
        for ids in conversations
        for workers in [[served.get(i) for i in ids]]
    ]
    return {
        "sessions": len(conversations),
        "turns": sum(map(len, conversations)),
        "turns_on_main_worker": sum(on_main) / sum(map(len, conversations)),
    }


def pick_cost_us(num_workers: int, num_picks: int = 20000) -> float:
    """Microseconds one scored pick takes in-process over `num_workers` workers with fresh load reports."""
    import random as random_module

    from deepspec_protocol.worker import WorkerLoad
    from service.gateway.routing import Endpoint, WorkerPool
    from service.gateway.worker_client import WorkerClient
    from service.metrics import GatewayMetrics

    pool = WorkerPool("", GatewayMetrics(), rng=random_module.Random(0), make_client=lambda address: None)
    for i in range(num_workers):
        # no client: picking reads the load reports only, never a worker
        endpoint = pool.endpoints[f"w{i}"] = Endpoint(f"w{i}", cast(WorkerClient, None), healthy=True, models={"m": 0})
        pool.observe_load(
            endpoint,
            WorkerLoad(
                num_running=i % 8, num_waiting=i % 3, num_slots=8, row_tokens_per_s=50.0 + i, acceptance={"batch": 2.0}
            ),
        )
    t0 = time.perf_counter()
    for _ in range(num_picks):
        pool.pick("m", prefix="p", service_class="batch")
    return (time.perf_counter() - t0) / num_picks * 1e6


def routing_cost(args) -> dict:
    """Added latency of a gateway scoring by goodput and of one using P2C, over the same two idle stub workers, the
    two alike in everything else (keys, service classes, admission cap, request log)."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    from service.gateway.worker_client import GenerationRequest, build_infer_request

    procs, goodput_url = start(args, "goodput", step_ms=0, tag="-cost")
    worker_ports = [int(w.args[w.args.index("--port") + 1]) for w in procs[1:]]
    samples: dict[str, list[float]] = {"direct": [], "goodput": [], "p2c": []}
    try:
        p2c, p2c_url = start_gateway(args, worker_ports, "p2c", tag="-p2c")
        procs.append(p2c)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(f"127.0.0.1:{worker_ports[0]}"))
        request = build_infer_request(
            GenerationRequest("b", "stub", prompt=PROMPT, max_tokens=16, temperature=0), stream=False
        )
        body = {"prompt": PROMPT, "max_tokens": 16, "temperature": 0}
        headers = {"authorization": "Bearer sk-chat"}
        with httpx.Client(timeout=30) as client:
            calls = {
                "direct": lambda: stub.ModelInfer(request),
                "goodput": lambda: client.post(goodput_url + "/v1/completions", json=body, headers=headers),
                "p2c": lambda: client.post(p2c_url + "/v1/completions", json=body, headers=headers),
            }
            gateways = {"goodput": procs[0].proc.pid, "p2c": p2c.proc.pid}
            cpu_before: dict[str, float | None] = {}
            for i in range(args.cost_requests + 30):
                if i == 30:  # warm-up done
                    cpu_before = {name: cpu_seconds(pid) for name, pid in gateways.items()}
                for name, call in calls.items():
                    t0 = time.perf_counter()
                    call()
                    if i >= 30:
                        samples[name].append((time.perf_counter() - t0) * 1e3)
            cpu_ms = {}
            for name, pid in gateways.items():
                before, after = cpu_before.get(name), cpu_seconds(pid)
                cpu_ms[name] = None if before is None or after is None else (after - before) * 1e3 / args.cost_requests
    finally:
        for proc in procs:
            proc.stop()
    direct = {q: percentile(samples["direct"], q) for q in (50, 99)}
    return {
        name: {
            "p50_ms": percentile(s, 50),
            "p99_ms": percentile(s, 99),
            "added_p50_ms": percentile(s, 50) - direct[50],
            "added_p99_ms": percentile(s, 99) - direct[99],
            **({"gateway_cpu_ms_per_request": cpu_ms[name]} if name in cpu_ms else {}),
        }
        for name, s in samples.items()
    }


async def classes_run(args) -> dict:
    procs, url = start(args)
    try:
        report = {}
        report["idle"] = latency(
            await closed_loop(url, "sk-chat", time.perf_counter() + args.idle_s, args.max_tokens, think_s=0.05)
        )
        report["capacity_rps"] = rate = await capacity(url, args)
        report["flood"] = await flood(url, args, rate)
        report["sessions"] = await sessions(url, args, rate, procs[0].log_path)
        return report
    finally:
        for proc in procs:
            proc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--step-ms", type=float, default=20.0, help="stub step time, ms (default 20)")
    parser.add_argument("--cap", type=int, default=4, help="--max-inflight-per-worker (default 4)")
    parser.add_argument("--reserve", type=int, default=2, help="--interactive-reserve-per-worker (default 2)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per request (default 32)")
    parser.add_argument("--idle-s", type=float, default=10.0, help="idle phase, seconds (default 10)")
    parser.add_argument("--capacity-s", type=float, default=8.0, help="capacity phase, seconds (default 8)")
    parser.add_argument("--flood-s", type=float, default=20.0, help="flood phase, seconds (default 20)")
    parser.add_argument("--cost-requests", type=int, default=300, help="requests per path, routing cost (300)")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = {
        "settings": vars(args),
        **asyncio.run(classes_run(args)),
        "routing_cost": routing_cost(args),
        "pick_us": {n: pick_cost_us(n) for n in (2, 16, 64)},
        "load_average_1m": os.getloadavg()[0],
    }
    (RESULTS / "service_classes.json").write_text(json.dumps(report, indent=2) + "\n")
    print(summary(report))


def summary(report: dict) -> str:
    idle, chat, fair = report["idle"], report["flood"]["interactive"], report["flood"]["fairness"]
    rows = [
        [
            "interactive TTFT p99 (ms), idle -> flood",
            f"{idle['ttft_p99_ms']:.1f} -> {chat['ttft_p99_ms']:.1f}",
            f"{chat['ttft_p99_ms'] / idle['ttft_p99_ms']:.2f}x",
            "<= 2x",
        ],
        [
            "interactive TPOT p50 (ms), idle -> flood",
            f"{idle['tpot_p50_ms']:.1f} -> {chat['tpot_p50_ms']:.1f}",
            f"{chat['tpot_p50_ms'] / idle['tpot_p50_ms'] - 1:+.1%}",
            "within 10%",
        ],
        ["5xx during the flood", report["flood"]["num_5xx"], json.dumps(report["flood"]["statuses"]), "0"],
    ]
    for key, entry in fair["keys"].items():
        rows.append(
            [
                f"{key} token share (weight share)",
                f"{entry['share']:.3f} ({entry['weight_share']:.3f})",
                f"{entry['share'] / entry['weight_share'] - 1:+.1%}",
                "within 10%",
            ]
        )
    rows.append(["Jain's fairness index (tokens / weight)", f"{fair['jain_index']:.3f}", "", "1 = fair"])
    sessions = report["sessions"]
    rows.append(
        [
            "session turns on one worker",
            f"{sessions['turns_on_main_worker']:.1%}",
            f"{sessions['turns']} turns",
            ">= 95%",
        ]
    )
    for name in ("goodput", "p2c"):
        cost = report["routing_cost"][name]
        added = f"{cost['added_p50_ms']:.2f} / {cost['added_p99_ms']:.2f}"
        cpu = cost.get("gateway_cpu_ms_per_request")
        detail = "" if cpu is None else f"gateway CPU {cpu:.3f} ms a request"
        target = "p99 <= 2 ms" if name == "goodput" else ""
        rows.append([f"gateway ({name}) added p50 / p99 (ms)", added, detail, target])
    picks = ", ".join(f"{n} workers {us:.1f} us" for n, us in report["pick_us"].items())
    rows.append(["scored pick, in-process", picks, "", ""])
    return (
        f"capacity {report['capacity_rps']:.1f} req/s; flood at 2x for {report['settings']['flood_s']:g} s; "
        f"load average {report['load_average_1m']:.1f}\n"
        + table(["measure", "value", "ratio / detail", "target"], rows)
    )


if __name__ == "__main__":
    main()
