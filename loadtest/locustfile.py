"""Locust users for teams that already run Locust: the same endpoints and prompts as `python -m loadtest`.

    pip install locust
    locust -f loadtest/locustfile.py --host http://127.0.0.1:8000                       # web UI on :8089
    locust -f loadtest/locustfile.py --host http://127.0.0.1:8000 --headless -u 32 -r 8 -t 2m ChatUser
    LOADTEST_GRPC=127.0.0.1:50051 locust -f loadtest/locustfile.py --headless -u 8 -r 8 -t 1m GrpcUser

Each streamed request is reported twice: under its endpoint with the full latency (e2e), and as request type
`TTFT` with the time to the first output text, so Locust's percentile tables show both. Locust measures in
gevent greenlets and is several times costlier per request than `python -m loadtest`; use the latter for
TPOT/ITL, goodput, spec-decode statistics and rates above a few hundred requests/s.

Settings (environment): LOADTEST_MODEL (default: first of /v1/models), LOADTEST_MAX_TOKENS (default 128),
LOADTEST_DATASET (a .jsonl file or directory; default loadtest/prompts), LOADTEST_GRPC (host:port).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import time

from locust import HttpUser, User, between, task

from loadtest.workload import DEFAULT_EVAL_DIR, load_turns

MAX_TOKENS = int(os.environ.get("LOADTEST_MAX_TOKENS", "128"))
_prompts = load_turns(os.environ.get("LOADTEST_DATASET", str(DEFAULT_EVAL_DIR)))
random.Random(0).shuffle(_prompts)
_next_prompt = itertools.cycle(_prompts).__next__


def _report(env, request_type: str, name: str, seconds: float, length: int = 0, exc: Exception | None = None) -> None:
    env.events.request.fire(
        request_type=request_type,
        name=name,
        response_time=seconds * 1000,
        response_length=length,
        exception=exc,
        context={},
    )


class _OpenAIUser(HttpUser):
    abstract = True
    wait_time = between(0, 0)
    endpoint = ""
    model: str | None = os.environ.get("LOADTEST_MODEL")

    def on_start(self) -> None:
        if self.model is None:
            with self.client.get("/v1/models", catch_response=True, name="/v1/models") as r:
                data = r.json().get("data", []) if r.status_code == 200 else []
                type(self).model = data[0]["id"] if data else ""

    def body(self, prompt: str) -> dict:
        raise NotImplementedError

    def text_of(self, chunk: dict) -> str | None:
        raise NotImplementedError

    def stream_one(self) -> None:
        body = {**self.body(_next_prompt()), "max_tokens": MAX_TOKENS, "stream": True}
        if self.model:
            body["model"] = self.model
        start = time.perf_counter()
        ttft = None
        with self.client.post(self.endpoint, json=body, stream=True, catch_response=True, name=self.endpoint) as r:
            if r.status_code != 200:
                r.failure(f"HTTP {r.status_code}")
                return
            try:
                for line in r.iter_lines():
                    if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    if ttft is None and self.text_of(chunk):
                        ttft = time.perf_counter() - start
            except ValueError as e:
                r.failure(f"malformed SSE: {e}")
                return
            if ttft is None:
                r.failure("no output text")
                return
            _report(self.environment, "TTFT", self.endpoint, ttft)


class CompletionsUser(_OpenAIUser):
    endpoint = "/v1/completions"

    def body(self, prompt: str) -> dict:
        return {"prompt": prompt}

    def text_of(self, chunk: dict) -> str | None:
        return (chunk.get("choices") or [{}])[0].get("text")

    @task
    def complete(self) -> None:
        self.stream_one()


class ChatUser(_OpenAIUser):
    endpoint = "/v1/chat/completions"

    def body(self, prompt: str) -> dict:
        return {"messages": [{"role": "user", "content": prompt}]}

    def text_of(self, chunk: dict) -> str | None:
        return ((chunk.get("choices") or [{}])[0].get("delta") or {}).get("content")

    @task
    def chat(self) -> None:
        self.stream_one()


class GrpcUser(User):
    """deepspec.v1.Completions/CompleteStream. Only runs when picked by name (weight 0 in a mixed run)."""

    weight = 0
    wait_time = between(0, 0)

    def on_start(self) -> None:
        import grpc
        import grpc.experimental.gevent as grpc_gevent

        from deepspec_protocol.protos.deepspec.v1 import completions_pb2, completions_pb2_grpc

        grpc_gevent.init_gevent()  # grpc's own threads would block gevent's loop otherwise
        self._pb = completions_pb2
        self._grpc = grpc
        address = os.environ.get("LOADTEST_GRPC", "127.0.0.1:50051")
        self._stub = completions_pb2_grpc.CompletionsStub(grpc.insecure_channel(address))

    @task
    def complete_stream(self) -> None:
        name = "deepspec.v1.Completions/CompleteStream"
        req = self._pb.CompletionRequest(prompt=_next_prompt(), max_tokens=MAX_TOKENS)
        start = time.perf_counter()
        ttft = None
        n = 0
        try:
            for chunk in self._stub.CompleteStream(req, timeout=600):
                if ttft is None and (chunk.text or chunk.num_tokens):
                    ttft = time.perf_counter() - start
                n += chunk.num_tokens
        except self._grpc.RpcError as e:
            _report(self.environment, "grpc", name, time.perf_counter() - start, exc=e)
            return
        _report(self.environment, "grpc", name, time.perf_counter() - start, n)
        if ttft is not None:
            _report(self.environment, "TTFT", name, ttft)
