"""Gateway overhead: added latency per request versus calling the worker directly, with the weightless stub target.

    python -m bench.service_overhead                  # ~1 min; prints a table
                                                      # (writes bench/results/service_overhead.json)
    python -m bench.service_overhead --requests 200   # shorter

Setup: one stub worker (`--target stub`, no step delay, so the model costs ~nothing) and one gateway in front of it,
each its own process. Requests are sequential (one in flight), each asks for 16 tokens (the stub commits them in
about five steps, i.e. five streamed worker responses), alternating paths request by request so both see the same
machine load:

  direct        the worker called as the gateway calls it: ModelInfer for whole completions, ModelStreamInfer read to
                the final response for streams (grpcio, one channel)
  HTTP          POST /v1/completions to the gateway (non-streaming, keep-alive http.client), whole JSON back
  HTTP stream   the same with "stream": true, read line by line to `data: [DONE]`
  gRPC          deepspec.v1.Completions/Complete on the gateway

added p50 = p50(path) - p50(direct of the same kind), likewise p99; percentiles are the median over --blocks
blocks, so one burst of load from other processes does not decide the result. Target: HTTP p50 added <= 2 ms, p99
added <= 10 ms.
"""

from __future__ import annotations

import argparse
import http.client as http_client
import json
import os
import statistics
import sys
import time

REPO_ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import grpc
from tritonclient.grpc import service_pb2_grpc

from bench.service_common import RESULTS, free_port, service, table
from deepspec_protocol.protos.deepspec.v1 import completions_pb2 as pb
from deepspec_protocol.protos.deepspec.v1 import completions_pb2_grpc as pb_grpc
from loadtest.metrics import percentile
from service.gateway.worker_client import GenerationRequest, build_infer_request

MAX_TOKENS = 16
PROMPT = "def fibonacci(n):"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=600, help="requests per path (default 600)")
    parser.add_argument("--blocks", type=int, default=3, help="report the median of per-block percentiles (default 3)")
    args = parser.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)

    worker_port, http_port, grpc_port = free_port(), free_port(), free_port()
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
        name="overhead-worker",
    )
    gateway = service(
        "gateway",
        "--workers",
        f"127.0.0.1:{worker_port}",
        "--host",
        "127.0.0.1",
        "--http-port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
        "--log-level",
        "WARNING",
        name="overhead-gateway",
    )
    try:
        gateway.wait_http(f"http://127.0.0.1:{http_port}/health/ready", 120)
        channel = grpc.insecure_channel(f"127.0.0.1:{worker_port}")
        worker_stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        gw_channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        gw_stub = pb_grpc.CompletionsStub(gw_channel)
        body = {"model": "stub", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}

        gen = GenerationRequest("b", "stub", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)

        def direct():
            worker_stub.ModelInfer(build_infer_request(gen, stream=False))

        def direct_stream():
            for response in worker_stub.ModelStreamInfer(iter([build_infer_request(gen)])):
                assert not response.error_message, response.error_message

        conn = http_client.HTTPConnection("127.0.0.1", http_port)
        payload = json.dumps(body)

        def via_http():  # stdlib http.client, keep-alive: the leanest Python HTTP client, as grpcio is for gRPC
            conn.request("POST", "/v1/completions", payload, {"content-type": "application/json"})
            response = conn.getresponse()
            data = response.read()
            assert response.status == 200 and json.loads(data)["usage"]["completion_tokens"] == MAX_TOKENS, data

        stream_payload = json.dumps({**body, "stream": True})

        def via_http_stream():
            conn.request("POST", "/v1/completions", stream_payload, {"content-type": "application/json"})
            response = conn.getresponse()
            last = b""
            while line := response.readline():  # chunked SSE, read event by event as a streaming client does
                last = line.strip() or last
            assert last == b"data: [DONE]", last

        def via_grpc():
            assert (
                gw_stub.Complete(pb.CompletionRequest(prompt=PROMPT, max_tokens=MAX_TOKENS)).usage.completion_tokens
                == MAX_TOKENS
            )

        def via_grpc_stream():
            assert (
                list(gw_stub.CompleteStream(pb.CompletionRequest(prompt=PROMPT, max_tokens=MAX_TOKENS)))[
                    -1
                ].usage.completion_tokens
                == MAX_TOKENS
            )

        paths = {
            "direct ModelInfer": direct,
            "gateway HTTP": via_http,
            "gateway gRPC": via_grpc,
            "direct ModelStreamInfer": direct_stream,
            "gateway HTTP stream": via_http_stream,
            "gateway gRPC stream": via_grpc_stream,
        }
        #: each gateway path against the direct call of the same kind
        baseline = {
            "gateway HTTP": "direct ModelInfer",
            "gateway gRPC": "direct ModelInfer",
            "gateway HTTP stream": "direct ModelStreamInfer",
            "gateway gRPC stream": "direct ModelStreamInfer",
        }
        for fn in paths.values():  # warm up connections and code paths
            for _ in range(30):
                fn()
        blocks: list[dict[str, list[float]]] = []
        for _ in range(args.blocks):
            samples: dict[str, list[float]] = {name: [] for name in paths}
            for _ in range(args.requests // args.blocks):
                for name, fn in paths.items():
                    t0 = time.perf_counter()
                    fn()
                    samples[name].append((time.perf_counter() - t0) * 1000)
            blocks.append(samples)
    finally:
        gateway.stop()
        worker.stop()

    def stat(name: str, q: float) -> float:  # median over blocks: one burst of load from other processes is one block
        return statistics.median(percentile(b[name], q) for b in blocks)

    rows, report = [], {"requests_per_path": args.requests, "max_tokens": MAX_TOKENS, "paths": {}}
    report["load_average_1m"] = os.getloadavg()[0]
    for name in paths:
        p50, p99 = stat(name, 50), stat(name, 99)
        entry = {"p50_ms": p50, "p99_ms": p99}
        if name in baseline:
            entry["added_p50_ms"] = p50 - stat(baseline[name], 50)
            entry["added_p99_ms"] = p99 - stat(baseline[name], 99)
        rows.append([name, p50, p99, entry.get("added_p50_ms", ""), entry.get("added_p99_ms", "")])
        report["paths"][name] = entry
    print(table(["path", "p50 ms", "p99 ms", "added p50 ms", "added p99 ms"], rows))
    http = report["paths"]["gateway HTTP"]
    http_ok = http["added_p50_ms"] <= 2 and http["added_p99_ms"] <= 10
    print(
        f"\ntarget (HTTP: added p50 <= 2 ms, p99 <= 10 ms): {'met' if http_ok else 'NOT met'}"
        f"  [load average {report['load_average_1m']:.1f} on {os.cpu_count()} CPUs]"
    )
    (RESULTS / "service_overhead.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
