"""Serving throughput on CPU: DeepSpec with its draft vs DeepSpec target-only vs llama-cpp-python's OpenAI server.

    python -m bench.service_throughput        # ~8 min; prints a table, writes bench/results/service_throughput.json
    python -m bench.service_throughput --rounds 1 --requests-per-client 1 --only deepspec-draft   # a quick look
    python -m bench.service_throughput --temperature 0 --temperature 1 --top-p 0.9   # sampled rows with nucleus

Workload: 8 concurrent streaming chat clients (`--concurrency`; closed loop), each sending `--requests-per-client`
prompts of `--dataset` (default HumanEval, datasets/eval/humaneval.jsonl; `chat` is the held-out chat set) with
max_tokens 128 at each `--temperature` (default 0 and 1; top-p `--top-p` on
the sampled ones), against

  deepspec-draft   `python -m service` (embedded default: smollm2-135m, draft auto = best shipped draft)
  deepspec-none    the same with `--draft none` (plain target decoding, same batching)
  llama-cpp        `python -m llama_cpp.server` on the same model's GGUF, `--n_threads 2 --interrupt_requests False`
                   (it serves one request at a time; the others wait)

output tok/s = completion tokens (usage when the server reports it, else streamed chunks) / wall time from the
first request sent to the last one finished. TTFT = request sent -> first content chunk. Targets (greedy rows):
draft >= 1.8x none and >= 1.5x llama-cpp in tok/s; draft p50 TTFT <= 1 s. Sampled rows: each deepspec server at
temperature 1 within 15% of its own greedy tok/s (sampled verification and its logits processing must not cost a
step much more than the argmax rule). Greedy rows are named by the server, sampled ones `<server> T=<t>`; a deepspec
server runs every temperature on one start, the peer only the first temperature.

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
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import httpx

from bench.isolated import describe_exit
from bench.service_common import RESULTS, Proc, free_port, service, table
from deepspec.paths import eval_dataset
from loadtest.metrics import percentile

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


def start(kind: str, port: int, extra: list[str], draft: str = "auto") -> tuple[Proc, str, str]:
    """Start a server → (process, model name, readiness URL); the caller waits for it. `draft`: the
    deepspec-draft server's --draft."""
    if kind == "llama-cpp":
        from deepspec.models.aliases import ALIASES  # the same GGUF file our engine dequantizes

        gguf = ALIASES["smollm2-135m"].locate()
        proc = Proc(
            [
                sys.executable,
                "-m",
                "llama_cpp.server",
                "--model",
                str(gguf),
                "--n_threads",
                "2",
                "--interrupt_requests",
                "False",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            "throughput-llama-cpp",
        )
        return proc, "SmolLM2-135M-Instruct", f"http://127.0.0.1:{port}/v1/models"
    draft = draft if kind == "deepspec-draft" else "none"
    proc = service(
        "--host",
        "127.0.0.1",
        "--http-port",
        str(port),
        "--grpc-port",
        "-1",
        "--metrics-port",
        "-1",
        "--draft",
        draft,
        "--log-level",
        "WARNING",
        *extra,
        name=f"throughput-{kind}",
    )
    return proc, "smollm2-135m", f"http://127.0.0.1:{port}/health/ready"


#: the sampled rows must stay within this fraction of their server's greedy tok/s
SAMPLED_TARGET = 0.85


def row_name(kind: str, temperature: float, top_p: float) -> str:
    """The report row of one server at one temperature: the bare server name for greedy."""
    if temperature <= 0:
        return kind
    return f"{kind} T={temperature:g}" + (f" top-p={top_p:g}" if top_p < 1 else "")


def sampled_vs_greedy(servers: dict, kinds: list[str], temperatures: list[float], top_p: float) -> dict:
    """{sampled row: {greedy, ratio, target}} for every server that has a greedy row and sampled rows."""
    out = {}
    for kind in kinds:
        if kind not in servers:
            continue
        for t in temperatures:
            name = row_name(kind, t, top_p)
            if t > 0 and name in servers:
                ratio = servers[name]["output_tok_per_s"] / servers[kind]["output_tok_per_s"]
                out[name] = {"greedy": kind, "ratio": ratio, "target": SAMPLED_TARGET}
    return out


def _number_option(option: str, expected: str, interval: str, inside: Callable[[float], bool]):
    """An argparse `type` for a float option, refusing with the option's own words: "`option` takes `expected`"
    for text that is no number, "`option` must be in `interval`" for a number outside it."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{option} takes {expected}, got {text!r}") from None
        if not inside(value):
            raise argparse.ArgumentTypeError(f"{option} must be in {interval}, got {text!r}")
        return value

    return parse


_temperature = _number_option("--temperature", "a number >= 0", "[0, 2]", lambda value: 0 <= value <= 2)
_top_p = _number_option("--top-p", "a number in (0, 1]", "(0, 1]", lambda value: 0 < value <= 1)


async def one_request(
    client: httpx.AsyncClient, url: str, model: str, prompt: str, temperature: float = 0.0, top_p: float = 1.0
) -> dict:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": MAX_TOKENS,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if temperature > 0 and top_p < 1:
        body["top_p"] = top_p
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


async def run_load(
    url: str,
    model: str,
    prompts: list[str],
    temperature: float = 0.0,
    top_p: float = 1.0,
    concurrency: int = CONCURRENCY,
) -> list[dict]:
    queue: asyncio.Queue = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)
    results: list[dict] = []

    async def client_loop(client):
        while not queue.empty():
            results.append(await one_request(client, url, model, queue.get_nowait(), temperature, top_p))

    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=httpx.Limits(max_connections=32)) as client:
        await one_request(client, url, model, "Say hi.", temperature, top_p)  # warm-up, not measured
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests-per-client", type=int, default=2, help="prompts each client sends (default 2)")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=CONCURRENCY,
        help=f"streaming clients at once (default {CONCURRENCY}; 1 = batch 1)",
    )
    parser.add_argument(
        "--dataset",
        default=DATASET.stem,
        help="eval set of datasets/eval to send (default %(default)s; chat = the held-out chat set), or a {turns} "
        ".jsonl(.gz) file such as training/data/synth/prompts.heldout.jsonl.gz",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=["deepspec-draft", "deepspec-none", "llama-cpp"],
        help="run only these servers (repeatable; default all three)",
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="times each server runs the workload, in alternating order (default 2)"
    )
    parser.add_argument(
        "--draft",
        default="auto",
        help="the deepspec-draft server's --draft (default auto = the best shipped draft), e.g. "
        "drafts/smollm2-135m-hybrid",
    )
    parser.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=0,
        help="draft tokens per verify round for the deepspec servers (default 0 = the service's default)",
    )
    from service.worker.fastest_backend import BACKENDS

    parser.add_argument(
        "--backend",
        "--engine",
        choices=BACKENDS,
        default=None,
        help="the deepspec servers' --backend (default: theirs, auto = the backend measured fastest "
        "here); --engine is its deprecated name",
    )
    parser.add_argument(
        "--temperature",
        type=_temperature,
        action="append",
        help="sampling temperature of a workload (repeatable; default 0 and 1; 0 = greedy)",
    )
    parser.add_argument("--top-p", type=_top_p, default=1.0, help="top-p of the sampled workloads (default 1 = off)")
    args = parser.parse_args(argv)
    if "--engine" in (sys.argv[1:] if argv is None else argv):
        print("python -m bench.service_throughput: warning: --engine is deprecated: use --backend", file=sys.stderr)
    temperatures = list(dict.fromkeys(args.temperature or [0.0, 1.0]))
    RESULTS.mkdir(parents=True, exist_ok=True)
    from training.data import read_jsonl_lines

    named = args.dataset.endswith((".jsonl", ".jsonl.gz"))
    lines = read_jsonl_lines(args.dataset if named else eval_dataset(args.dataset))
    prompts = [json.loads(line)["turns"][0] for line in lines[: args.concurrency * args.requests_per_client]]

    report = {
        "concurrency": args.concurrency,
        "dataset": args.dataset,
        "max_tokens": MAX_TOKENS,
        "num_requests": len(prompts),
        "rounds": args.rounds,
        "temperatures": temperatures,
        "top_p": args.top_p,
        "servers": {},
    }
    kinds = args.only or ["deepspec-draft", "deepspec-none", "llama-cpp"]
    runs: dict[str, list[dict]] = {}
    failed: dict[str, str] = {}
    for round_index in range(args.rounds):
        for kind in kinds if round_index % 2 == 0 else kinds[::-1]:
            if kind in failed:
                continue
            temps = temperatures[:1] if kind in PEERS else temperatures
            temps = temps if round_index % 2 == 0 else temps[::-1]
            port = free_port()
            print(f"round {round_index + 1}/{args.rounds}: starting {kind} ...", flush=True)
            extra = (
                ["--num-speculative-tokens", str(args.num_speculative_tokens)] if args.num_speculative_tokens else []
            )
            extra += ["--backend", args.backend] if args.backend else []
            proc, model, ready_url = start(kind, port, extra, args.draft)
            try:
                proc.wait_http(ready_url, 600)
                measured = {
                    t: asyncio.run(
                        run_load(f"http://127.0.0.1:{port}", model, prompts, t, args.top_p, args.concurrency)
                    )
                    for t in temps
                }
            except (RuntimeError, TimeoutError, httpx.HTTPError) as e:
                # a peer's server is a process of its own: if it dies (a llama.cpp built for another CPU gets
                # SIGILL), its row says so and the other servers still run; our own servers failing stops the run
                if kind not in PEERS:
                    raise
                failed[kind] = peer_status(proc, e)
                print(f"  {kind}: {failed[kind]}; its row is left out", flush=True)
                for t in temps:
                    runs.pop(row_name(kind, t, args.top_p), None)
                continue
            finally:
                proc.stop()
            for t in temperatures:
                if t not in measured:
                    continue
                results = measured[t]
                name = row_name(kind, t, args.top_p)
                wall = max(r["done"] for r in results) - min(r["sent"] for r in results)
                tokens = sum(r["tokens"] for r in results)
                runs.setdefault(name, []).append(
                    {
                        "output_tokens": tokens,
                        "wall_s": wall,
                        "output_tok_per_s": tokens / wall,
                        "ttfts_s": [r["ttft_s"] for r in results],
                        "load_average_1m": os.getloadavg()[0],
                    }
                )
                print(f"  {name}: {tokens / wall:.1f} tok/s", flush=True)

    for name, name_runs in runs.items():
        ttfts = [t for run in name_runs for t in run["ttfts_s"]]
        report["servers"][name] = {
            "output_tok_per_s": statistics.median(run["output_tok_per_s"] for run in name_runs),
            "rounds_tok_per_s": [round(run["output_tok_per_s"], 2) for run in name_runs],
            "ttft_p50_s": percentile(ttfts, 50),
            "ttft_p90_s": percentile(ttfts, 90),
            "ttfts_s": sorted(round(t, 3) for t in ttfts),
            "load_average_1m": [round(run["load_average_1m"], 2) for run in name_runs],
        }

    servers = report["servers"]
    sampled = sampled_vs_greedy(servers, kinds, temperatures, args.top_p)
    report["sampled_vs_greedy"] = sampled
    rows = [
        [
            k,
            ", ".join(f"{t:.1f}" for t in v["rounds_tok_per_s"]),
            v["output_tok_per_s"],
            f"{sampled[k]['ratio']:.2f}x" if k in sampled else "-",
            v["ttft_p50_s"],
            v["ttft_p90_s"],
            ", ".join(str(x) for x in v["load_average_1m"]),
        ]
        for k, v in servers.items()
    ]
    rows += [[kind, status, "-", "-", "-", "-", "-"] for kind, status in failed.items()]
    report["failed"] = failed
    print(
        table(
            ["server", "tok/s per round", "median tok/s", "vs greedy", "TTFT p50 s", "TTFT p90 s", "load avg after"],
            rows,
        )
    )
    print(f"load average: other processes share the {os.cpu_count()} CPUs")
    if "deepspec-draft" in servers:
        draft = servers["deepspec-draft"]
        for other, target in (("deepspec-none", 1.8), ("llama-cpp", 1.5)):
            if other in servers:
                ratio = draft["output_tok_per_s"] / servers[other]["output_tok_per_s"]
                report[f"speedup_vs_{other}"] = ratio
                print(f"draft vs {other}: {ratio:.2f}x (target >= {target}x)")
        print(f"draft p50 TTFT: {draft['ttft_p50_s']:.2f} s (target <= 1 s)")
    for name, row in sampled.items():
        print(f"{name} vs {row['greedy']}: {row['ratio']:.2f}x of greedy tok/s (target >= {row['target']:.2f}x)")
    (RESULTS / "service_throughput.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
