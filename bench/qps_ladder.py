"""Goodput at a TPOT objective on a QPS ladder: speculation decided per round, always on, and off.

    python -m bench.qps_ladder                          # rates 1,2,4,8,16; ~15 min; bench/results/qps_ladder.json
    python -m bench.qps_ladder --rates 1,4 --duration-s 15 --tpot-ms 60

Three policies on the served default (native decoder, `--draft auto`), each its own worker + gateway process:

  auto   the worker as served: the verification budget (deepspec/decoding/planner.py BudgetPlanner) drafts a row
         only as deep as the measured step curve says pays, given how full the batch is;
  on     `--planner verify-all`: every round verifies what the drafter proposes (vLLM's fixed
         num_speculative_tokens), however full the batch;
  off    the same `auto` worker, every request sent with `speculation: {"mode": "off"}` (the gateway's per-request
         field): the target alone, same batching.

At each rate, requests arrive open-loop (Poisson, one seed for every policy, so each sees the same arrival times and
prompts) for `--duration-s`, cycling a mixed workload: chat (datasets/eval/chat.jsonl), code (humaneval) and JSON
(chat prompts asking for a JSON object, sent with `response_format: {"type": "json_object"}`). Every request
streams `--max-tokens` tokens at temperature 0. A request still running `--drain-s` after the last arrival is
cancelled and counts as missed. Reported per policy and rate: goodput (tokens per second of the requests whose TPOT
met `--tpot-ms` and that finished), output tok/s of all requests, TPOT p50 and TTFT p99, and 429/5xx counts. The
issue's rule: `auto`'s goodput >= the better of `on` and `off` at every rate, and never below `off`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import httpx

from bench.machine import cpu_flags, write_results
from bench.service_classes import stream_one
from bench.service_common import RESULTS, free_port, service, table
from loadtest.metrics import percentile

POLICIES = ("auto", "on", "off")
JSON_ASK = " Answer with a JSON object whose keys are 'answer' and 'reasons'."


def workload(count: int, seed: int) -> list[dict]:
    """`count` request bodies (without model/stream fields), chat / code / JSON in turn, prompts in seeded order."""
    sets = {name: _first_turns(REPO_ROOT / "datasets" / "eval" / f"{name}.jsonl") for name in ("chat", "humaneval")}
    rng = random.Random(seed)
    for prompts in sets.values():
        rng.shuffle(prompts)
    bodies = []
    for i in range(count):
        kind = ("chat", "code", "json")[i % 3]
        if kind == "code":
            prompt = sets["humaneval"][i % len(sets["humaneval"])]
            bodies.append({"kind": kind, "messages": [{"role": "user", "content": prompt}]})
        else:
            prompt = sets["chat"][i % len(sets["chat"])] + (JSON_ASK if kind == "json" else "")
            body = {"kind": kind, "messages": [{"role": "user", "content": prompt}]}
            if kind == "json":
                body["response_format"] = {"type": "json_object"}
            bodies.append(body)
    return bodies


def _first_turns(path: Path) -> list[str]:
    return [json.loads(line)["turns"][0] for line in path.read_text().splitlines() if line.strip()]


def arrivals(rate: float, duration_s: float, seed: int) -> list[float]:
    """Poisson arrival offsets (s) over `duration_s` at `rate` requests/s."""
    rng = random.Random(seed)
    out, t = [], rng.expovariate(rate)
    while t < duration_s:
        out.append(t)
        t += rng.expovariate(rate)
    return out


async def one_request(client: httpx.AsyncClient, url: str, body: dict, args, off: bool) -> dict:
    """One streamed request of the workload (bench.service_classes.stream_one reads the stream)."""
    extra = {k: v for k, v in body.items() if k not in ("kind", "messages")}
    if off:
        extra["speculation"] = {"mode": "off"}
    result = await stream_one(client, url, "none", args.max_tokens, body["messages"], extra=extra)
    if result["status"] != 200:
        return {"kind": body["kind"], "status": result["status"], "tokens": 0}
    return {
        "kind": body["kind"],
        "status": 200,
        "tokens": result["completion_tokens"],
        "ttft_s": result["ttft"],
        "tpot_s": result["tpot"] or 0.0,
    }


async def run_rate(url: str, rate: float, args, off: bool) -> dict:
    offsets = arrivals(rate, args.duration_s, args.seed)
    bodies = workload(len(offsets), args.seed)
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(timeout=httpx.Timeout(args.duration_s + args.drain_s + 60), limits=limits) as client:
        start = time.perf_counter()

        async def fire(offset: float, body: dict) -> dict:
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            return await one_request(client, url, body, args, off)

        tasks = [asyncio.create_task(fire(o, b)) for o, b in zip(offsets, bodies)]
        done, pending = await asyncio.wait(tasks, timeout=args.duration_s + args.drain_s)
        for task in pending:
            task.cancel()
        wall = time.perf_counter() - start
    results = [t.result() for t in done if not t.exception()]
    return summarize(results, len(tasks), len(pending), wall, args.tpot_ms / 1000)


def summarize(results: list[dict], sent: int, cancelled: int, wall_s: float, tpot_objective_s: float) -> dict:
    ok = [r for r in results if r["status"] == 200]
    good = [r for r in ok if r["tpot_s"] <= tpot_objective_s]
    return {
        "requests": sent,
        "finished": len(ok),
        "cancelled": cancelled,
        "status_429": sum(r["status"] == 429 for r in results),
        "status_5xx": sum(r["status"] >= 500 for r in results),
        "goodput_tok_s": sum(r["tokens"] for r in good) / wall_s,
        "output_tok_s": sum(r["tokens"] for r in ok) / wall_s,
        "tpot_p50_ms": 1000 * percentile([r["tpot_s"] for r in ok], 50) if ok else None,
        "ttft_p99_ms": 1000 * percentile([r["ttft_s"] for r in ok], 99) if ok else None,
        "wall_s": wall_s,
        "tpot_p50_ms_by_kind": {
            kind: 1000 * percentile([r["tpot_s"] for r in ok if r["kind"] == kind], 50)
            for kind in sorted({r["kind"] for r in ok})
        },
    }


def run_policy(policy: str, rates: list[float], args) -> dict[float, dict]:
    port, grpc_port = free_port(), free_port()
    while grpc_port == port:  # a port just closed may be handed out again
        grpc_port = free_port()
    flags = ["--draft", args.draft, "--http-port", str(port), "--grpc-port", str(grpc_port)]
    flags += ["--metrics-port", "-1", "--log-level", "warning"]
    flags += ["--planner", "verify-all"] if policy == "on" else []
    proc = service(*flags, name=f"qps-ladder-{policy}")
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/health/ready", 900)
        url = f"http://127.0.0.1:{port}"
        asyncio.run(run_rate(url, 0.5, argparse.Namespace(**{**vars(args), "duration_s": 4}), False))  # warm
        out = {}
        for rate in rates:
            out[rate] = asyncio.run(run_rate(url, rate, args, off=policy == "off"))
            row = out[rate]
            print(
                f"  {policy} @ {rate:g} req/s: goodput {row['goodput_tok_s']:.1f} tok/s, "
                f"output {row['output_tok_s']:.1f}, TPOT p50 {row['tpot_p50_ms']} ms",
                flush=True,
            )
        return out
    finally:
        proc.stop()


def verdicts(measured: dict[str, dict[float, dict]], rates: list[float]) -> list[list]:
    rows = []
    for rate in rates:
        good = {p: measured[p][rate]["goodput_tok_s"] for p in POLICIES}
        best_other = max(good["on"], good["off"])
        rows.append(
            [
                f"{rate:g}",
                *(good[p] for p in POLICIES),
                good["auto"] / best_other if best_other else float("nan"),
                good["auto"] / good["off"] if good["off"] else float("nan"),
            ]
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.qps_ladder", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", default="1,2,4,8,16", help="requests/s, comma list (default: %(default)s)")
    parser.add_argument("--duration-s", type=float, default=30.0, help="arrivals per rate (default: %(default)s)")
    parser.add_argument(
        "--drain-s", type=float, default=30.0, help="wait after the last arrival (default: %(default)s s)"
    )
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per request (default: %(default)s)")
    parser.add_argument("--tpot-ms", type=float, default=50.0, help="TPOT objective (default: %(default)s)")
    parser.add_argument("--draft", default="auto", help="the workers' --draft (default: %(default)s)")
    parser.add_argument("--policies", default=",".join(POLICIES), help="subset to run (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "qps_ladder.json")
    args = parser.parse_args(argv)
    try:
        rates = [float(r) for r in args.rates.split(",")]
    except ValueError:
        parser.error(f"--rates: not a comma list of numbers: {args.rates!r}")
    policies = args.policies.split(",")
    unknown = sorted(set(policies) - set(POLICIES))
    if unknown or any(r <= 0 for r in rates):
        parser.error(f"--policies must be among {POLICIES} (got {unknown}); --rates must be > 0")
    measured = {}
    for policy in policies:
        print(f"policy {policy} ...", flush=True)
        measured[policy] = run_policy(policy, rates, args)
    summary = []
    if set(POLICIES) <= set(measured):
        headers = ["req/s", "auto goodput", "on goodput", "off goodput", "auto / max(on, off)", "auto / off"]
        rows = verdicts(measured, rates)
        summary = [dict(zip(headers, row)) for row in rows]
        print(f"CPU flags: {cpu_flags()}\n" + table(headers, rows))
    write_results(args.out, args, policies=measured, table=summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
