"""Session affinity through the gateway: agent-style sessions over real workers, each session's turns kept on one
worker (the gateway's goodput routing) against spread over them (`routing: p2c`, which ignores sessions).

    python -m bench.session_affinity                   # 6 sessions x 4 turns x 128 tokens; ~10 min on 2 cores
    python -m bench.session_affinity --sessions 2 --turns 3 --max-tokens 64     # a quick look
    python -m bench.session_affinity --kind repeat     # each step re-sent unchanged: where memory drafts the most
    python -m bench.session_affinity --workers 4       # P2C then puts fewer later turns where the session was

Why it matters: session memory (deepspec/decoding/session_memory.py) lets a worker's drafter draft from the answers
it served earlier in the same session, and only the worker that served them holds them. Setup: two workers
(`--workers`) as served (native decoder, `--draft auto`) and two gateways over them, one per routing, with two API
keys: one whose policy opts into session memory (`session_memory: true`), one without. Three modes: affinity on
(goodput routing, the memory key), affinity off (P2C, the memory key) and no session memory (goodput routing, the
other key). The sessions are bench.session_replay's conversations (a coding task, then by default the task re-issued
after a tool result), sent as chat completions at temperature 0 with `x-session-id` set, one request at a time;
each session is replayed through every mode in turn (distinct session ids, so no mode drafts from another's
answers), so all see the same worker state.

Reported per mode, over the turns after each session's first (nothing is remembered before it): the share of each
session's turns on its most used worker, the share of those later turns whose worker had served an earlier turn of
the session (memory was there to draft from), τ (tokens committed per drafted round, from the responses'
`usage.speculation`), tokens per target forward (completion tokens / (completion - accepted): prefill and every
verify round commit one token of their own), and tok/s. τ and tokens per forward are counts: machine load does not
move them. The issue's rule: τ with affinity >= 1.5x without. Affinity can add at most what memory adds (the
`no session memory` row: affinity on, the key without memory), less what the turns that P2C happens to put on a
worker already holding the session get without it (turn t finds one with probability 1 - (1 - 1/workers)^t: about
two thirds of the later turns of 4 over two workers, two fifths over four).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import httpx

from bench.machine import cpu_flags, write_results
from bench.service_classes import workers_by_id
from bench.service_common import RESULTS, Proc, free_port, local_gateway, service, table
from bench.session_replay import KINDS, conversations

#: per mode: the gateway's routing and the API key sent (its policy: session memory or not)
MODES = {
    "affinity on": ("goodput", "sk-agent"),
    "affinity off": ("p2c", "sk-agent"),
    "no session memory": ("goodput", "sk-plain"),
}
POLICY = {
    "keys": {
        "sk-agent": {"service_class": "interactive", "session_memory": True},
        "sk-plain": {"service_class": "interactive"},
    }
}


def start_workers(args) -> list[Proc]:
    workers = []
    for i in range(args.workers):
        port = free_port()
        flags = ["--target", args.target, "--draft", args.draft, "--backend", "native", "--host", "127.0.0.1"]
        flags += ["--port", str(port), "--metrics-port", "-1", "--log-level", "warning"]
        workers.append(service("worker", *flags, name=f"affinity-worker-{i}"))
    return workers


def worker_port(worker: Proc) -> str:
    return worker.args[worker.args.index("--port") + 1]


def wait_ready(worker: Proc, timeout_s: float = 900) -> None:
    """Until the worker's KServe ServerReady says so (its model loaded; the first start compiles the decoder)."""
    import tritonclient.grpc as triton

    client = triton.InferenceServerClient(f"127.0.0.1:{worker_port(worker)}")
    try:
        worker.wait_until(lambda: client.is_server_ready(client_timeout=1), timeout_s)
    finally:
        client.close()


def start_gateway(workers: list[Proc], routing: str) -> tuple[Proc, str]:
    """A gateway over `workers` routing by `routing`, its request log at INFO (the worker of each response)."""
    http_port = free_port()
    env = {"DEEPSPEC_GATEWAY_SERVICE_CLASSES": json.dumps(POLICY), "DEEPSPEC_GATEWAY_ROUTING": routing}
    gateway = local_gateway([worker_port(w) for w in workers], http_port, name=f"affinity-gateway-{routing}", env=env)
    return gateway, f"http://127.0.0.1:{http_port}"


def turn(client: httpx.Client, url: str, key: str, text: str, session: str, max_tokens: int) -> dict:
    """One chat completion of a session sent with API key `key`: its id, usage and seconds."""
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0}
    headers = {"authorization": f"Bearer {key}", **({"x-session-id": session} if session else {})}
    t0 = time.perf_counter()
    response = client.post(url + "/v1/chat/completions", json=body, headers=headers)
    seconds = time.perf_counter() - t0
    response.raise_for_status()
    data = response.json()
    return {"id": data["id"], "usage": data["usage"], "seconds": seconds}


def summarize(sessions: list[list[dict]]) -> dict:
    """One mode's numbers from its sessions' turns (each with `usage`, `seconds` and the `worker` that served it)."""
    later = [t for turns in sessions for t in turns[1:]]
    spec = [t["usage"].get("speculation", {}) for t in later]
    accepted = sum(s.get("accepted_tokens", 0) for s in spec)
    rounds = sum(s.get("drafted_rounds", 0) for s in spec)
    completion = sum(t["usage"]["completion_tokens"] for t in later)
    workers = [[t["worker"] for t in turns] for turns in sessions]
    revisits = sum(w[i] in w[:i] for w in workers for i in range(1, len(w)))
    return {
        "turns_on_main_worker": sum(max(map(w.count, set(w))) for w in workers) / sum(map(len, workers)),
        "later_turns_on_an_earlier_turns_worker": revisits / max(len(later), 1),
        "tau": (accepted + rounds) / rounds if rounds else None,
        "tokens_per_forward": completion / max(completion - accepted, 1),
        "tok_s": completion / sum(t["seconds"] for t in later),
        "completion_tokens": completion,
        "accepted_tokens": accepted,
        "drafted_rounds": rounds,
        "workers": workers,
    }


def replay(args) -> dict[str, dict]:
    """Every session through each mode in turn (one request at a time); each mode's `summarize`."""
    convs = conversations(args.sessions, args.turns, args.kind)
    workers = start_workers(args)
    gateways: dict[str, tuple[Proc, str]] = {}
    try:
        for worker in workers:
            wait_ready(worker)
        for routing in sorted({routing for routing, _ in MODES.values()}):
            gateways[routing] = start_gateway(workers, routing)
        for proc, url in gateways.values():
            proc.wait_http(f"{url}/health/ready", 900)
        turns: dict[str, list[list[dict]]] = {mode: [] for mode in MODES}
        with httpx.Client(timeout=600) as client:
            for _, url in gateways.values():  # warm-up, no session: nothing is remembered
                for _ in range(2):
                    turn(client, url, "sk-plain", "Hi", "", 8)
            for c, texts in enumerate(convs):
                for mode, (routing, key) in MODES.items():
                    url, session = gateways[routing][1], f"{mode}: conversation {c}"
                    turns[mode].append([turn(client, url, key, text, session, args.max_tokens) for text in texts])
                print(f"  session {c + 1} of {len(convs)} done in every mode", flush=True)
        time.sleep(0.5)  # the last request-log lines
        served = {routing: workers_by_id(proc.log_path) for routing, (proc, _) in gateways.items()}
        for mode, (routing, _) in MODES.items():
            for session in turns[mode]:
                for t in session:
                    t["worker"] = served[routing].get(t["id"])
        return {mode: summarize(turns[mode]) for mode in MODES}
    finally:
        for proc, _ in gateways.values():
            proc.stop()
        for worker in workers:
            worker.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.session_affinity",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--target", default="smollm2-135m", help="the workers' --target (default: %(default)s)")
    parser.add_argument("--draft", default="auto", help="the workers' --draft (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=2, help="workers behind the gateways (default 2)")
    parser.add_argument("--sessions", type=int, default=6, help="sessions, one coding task each (default 6)")
    parser.add_argument("--turns", type=int, default=4, help="requests per session (default 4)")
    parser.add_argument("--kind", choices=KINDS, default="retry", help="bench.session_replay's --kind (default retry)")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per request (default 128)")
    parser.add_argument("--out", type=Path, default=RESULTS / "session_affinity.json")
    args = parser.parse_args(argv)
    if args.workers < 2 or args.sessions < 1 or args.turns < 2 or args.max_tokens < 1:
        parser.error("--workers >= 2, --sessions >= 1, --turns >= 2 and --max-tokens >= 1")
    load_before = os.getloadavg()[0]
    modes = replay(args)
    taus = {mode: m["tau"] for mode, m in modes.items()}
    ratio = taus["affinity on"] / taus["affinity off"] if all(taus.values()) else None
    ceiling = taus["affinity on"] / taus["no session memory"] if all(taus.values()) else None
    headers = ["mode", "turns on one worker", "later turns on an earlier turn's worker", "tau", "tokens/forward"]
    headers.append("tok/s")
    rows = [
        [
            mode,
            m["turns_on_main_worker"],
            m["later_turns_on_an_earlier_turns_worker"],
            m["tau"] or 0.0,
            m["tokens_per_forward"],
            m["tok_s"],
        ]
        for mode, m in modes.items()
    ]
    load = (load_before, os.getloadavg()[0])
    print(
        f"{args.sessions} sessions x {args.turns} turns ({args.kind}) x {args.max_tokens} tokens, "
        f"{args.workers} workers ({args.target}, --draft {args.draft}, native); "
        f"load average {load[0]:.1f} -> {load[1]:.1f}; "
        f"CPU flags: {cpu_flags()}\n"
        + table(headers, rows)
        + f"\ntau affinity on / off: {ratio and f'{ratio:.2f}x'} (target >= 1.5x); "
        f"affinity on / no session memory (what memory itself adds): {ceiling and f'{ceiling:.2f}x'}"
    )
    write_results(args.out, args, modes=modes, tau_ratio=ratio, tau_ratio_to_no_memory=ceiling, load_average_1m=load)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
