"""Serving throughput on CPU: DeepSpec with its draft vs DeepSpec target-only vs llama-cpp-python's OpenAI server.

    python -m bench.service_throughput                # ~5 min; prints a table, writes bench/results/service_throughput.json
    python -m bench.service_throughput --rounds 1 --requests-per-client 1 --only deepspec-draft   # a quick look

Workload: 8 concurrent streaming chat clients (closed loop), each sending `--requests-per-client` HumanEval prompts
(datasets/eval/humaneval.jsonl) with max_tokens 128 and temperature 0, against

  deepspec-draft   `python -m service` (embedded default: smollm2-135m, draft auto = best shipped draft)
  deepspec-none    the same with `--draft none` (plain target decoding, same batching)
  llama-cpp        `python -m llama_cpp.server` on the same model's GGUF, `--n_threads 2 --interrupt_requests False`
                   (it serves one request at a time; the others wait)

output tok/s = completion tokens (usage when the server reports it, else streamed chunks) / wall time from the
first request sent to the last one finished. TTFT = request sent -> first content chunk. Targets: draft >= 1.8x
none and >= 1.5x llama-cpp in tok/s; draft p50 TTFT <= 1 s.

The servers take turns over `--rounds` rounds, in reversed order every other round, and each reports the median
of its rounds (TTFT percentiles pool every request). This VM's speed drifts over minutes; in a single pass, the
server that happens to run in a slow phase looks slower than it is.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import httpx  # noqa: E402

from bench.isolated import describe_exit  # noqa: E402
from bench.service_common import RESULTS, Proc, free_port, service, table  # noqa: E402
from deepspec.paths import eval_dataset  # noqa: E402
from loadtest.metrics import percentile  # noqa: E402

DATASET = eval_dataset("humaneval")
CONCURRENCY = 8
MAX_TOKENS = 128
#: servers that are not ours: one that dies costs its own row, not the run
PEERS = ("llama-cpp",)


def peer_status(proc: Proc, error: Exception) -> str:
    """`crashed: signal 4 (SIGILL)` when the server process died, else the error that stopped its round."""
    try:  # a dropped connection can arrive a moment before the process is reaped
        code = proc.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        code = None
    return describe_exit(code) if code is not None else f"failed: {type(error).__name__}: {str(error)[:200]}"


def start(kind: str, port: int, extra: list[str]) -> tuple[Proc, str, str]:
    """Start a server → (process, model name, readiness URL); the caller waits for it."""
    if kind == "llama-cpp":
        from deepspec.models.aliases import ALIASES  # the same GGUF file our engine dequantizes

        gguf = ALIASES["smollm2-135m"].locate()
        proc = Proc([sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--n_threads", "2",
                     "--interrupt_requests", "False", "--host", "127.0.0.1", "--port", str(port)], "throughput-llama-cpp")  # fmt: skip
        return proc, "SmolLM2-135M-Instruct", f"http://127.0.0.1:{port}/v1/models"
    draft = "auto" if kind == "deepspec-draft" else "none"
    proc = service("--host", "127.0.0.1", "--http-port", str(port), "--grpc-port", "-1", "--metrics-port", "-1",
                   "--draft", draft, "--log-level", "WARNING", *extra, name=f"throughput-{kind}")  # fmt: skip
    return proc, "smollm2-135m", f"http://127.0.0.1:{port}/health/ready"


async def one_request(client: httpx.AsyncClient, url: str, model: str, prompt: str) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    sent = time.perf_counter()
    first = None
    chunks = 0
    usage = None
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(event["error"])
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    chunks += 1
                    if first is None:
                        first = time.perf_counter()
    done = time.perf_counter()
    tokens = usage["completion_tokens"] if usage else chunks
    return {"sent": sent, "ttft_s": (first or done) - sent, "done": done, "tokens": tokens}


async def run_load(url: str, model: str, prompts: list[str]) -> list[dict]:
    queue: asyncio.Queue = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)
    results: list[dict] = []

    async def client_loop(client):
        while not queue.empty():
            results.append(await one_request(client, url, model, queue.get_nowait()))

    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=httpx.Limits(max_connections=32)) as client:
        await one_request(client, url, model, "Say hi.")  # warm-up, not measured
        await asyncio.gather(*(client_loop(client) for _ in range(CONCURRENCY)))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests-per-client", type=int, default=2, help="prompts each of the 8 clients sends (default 2)")
    parser.add_argument("--only", action="append", choices=["deepspec-draft", "deepspec-none", "llama-cpp"],
                        help="run only these servers (repeatable; default all three)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="times each server runs the workload, in alternating order (default 2)")
    parser.add_argument("--num-speculative-tokens", type=int, default=0,
                        help="draft tokens per verify round for the deepspec servers (default 0 = the service's default)")
    args = parser.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    lines = DATASET.read_text().splitlines()
    prompts = [json.loads(line)["turns"][0] for line in lines[: CONCURRENCY * args.requests_per_client]]

    report = {"concurrency": CONCURRENCY, "max_tokens": MAX_TOKENS, "num_requests": len(prompts),
              "rounds": args.rounds, "servers": {}}  # fmt: skip
    kinds = args.only or ["deepspec-draft", "deepspec-none", "llama-cpp"]
    runs: dict[str, list[dict]] = {kind: [] for kind in kinds}
    failed: dict[str, str] = {}
    for round_index in range(args.rounds):
        for kind in kinds if round_index % 2 == 0 else kinds[::-1]:
            if kind in failed:
                continue
            port = free_port()
            print(f"round {round_index + 1}/{args.rounds}: starting {kind} ...", flush=True)
            extra = ["--num-speculative-tokens", str(args.num_speculative_tokens)] if args.num_speculative_tokens else []
            proc, model, ready_url = start(kind, port, extra)
            try:
                proc.wait_http(ready_url, 600)
                results = asyncio.run(run_load(f"http://127.0.0.1:{port}", model, prompts))
            except (RuntimeError, TimeoutError, httpx.HTTPError) as e:
                # a peer's server is a process of its own: if it dies (a llama.cpp built for another CPU gets
                # SIGILL), its row says so and the other servers still run; our own servers failing stops the run
                if kind not in PEERS:
                    raise
                failed[kind] = peer_status(proc, e)
                print(f"  {kind}: {failed[kind]}; its row is left out", flush=True)
                runs.pop(kind, None)
                continue
            finally:
                proc.stop()
            wall = max(r["done"] for r in results) - min(r["sent"] for r in results)
            tokens = sum(r["tokens"] for r in results)
            runs[kind].append({"output_tokens": tokens, "wall_s": wall, "output_tok_per_s": tokens / wall,
                               "ttfts_s": [r["ttft_s"] for r in results], "load_average_1m": os.getloadavg()[0]})
            print(f"  {kind}: {tokens / wall:.1f} tok/s", flush=True)

    for kind, kind_runs in runs.items():
        ttfts = [t for run in kind_runs for t in run["ttfts_s"]]
        report["servers"][kind] = {
            "output_tok_per_s": statistics.median(run["output_tok_per_s"] for run in kind_runs),
            "rounds_tok_per_s": [round(run["output_tok_per_s"], 2) for run in kind_runs],
            "ttft_p50_s": percentile(ttfts, 50), "ttft_p90_s": percentile(ttfts, 90),
            "ttfts_s": sorted(round(t, 3) for t in ttfts),
            "load_average_1m": [round(run["load_average_1m"], 2) for run in kind_runs]}  # fmt: skip

    servers = report["servers"]
    rows = [[k, ", ".join(f"{t:.1f}" for t in v["rounds_tok_per_s"]), v["output_tok_per_s"], v["ttft_p50_s"],
             v["ttft_p90_s"], ", ".join(str(x) for x in v["load_average_1m"])] for k, v in servers.items()]  # fmt: skip
    rows += [[kind, status, "-", "-", "-", "-"] for kind, status in failed.items()]
    report["failed"] = failed
    print(table(["server", "tok/s per round", "median tok/s", "TTFT p50 s", "TTFT p90 s", "load avg after"], rows))
    print(f"load average: other processes share the {os.cpu_count()} CPUs")
    if "deepspec-draft" in servers:
        draft = servers["deepspec-draft"]
        for other, target in (("deepspec-none", 1.8), ("llama-cpp", 1.5)):
            if other in servers:
                ratio = draft["output_tok_per_s"] / servers[other]["output_tok_per_s"]
                report[f"speedup_vs_{other}"] = ratio
                print(f"draft vs {other}: {ratio:.2f}x (target >= {target}x)")
        print(f"draft p50 TTFT: {draft['ttft_p50_s']:.2f} s (target <= 1 s)")
    (RESULTS / "service_throughput.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
