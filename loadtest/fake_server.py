"""A fake OpenAI-compatible server with fixed latencies, for the tests, the overhead benchmark and dry runs.

Why it exists: to check the load tester's maths against known answers (TTFT, ITL and token counts are set, not
measured) and to show the tool is not the bottleneck (`bench/loadtest_overhead.py`). It is a raw asyncio HTTP/1.1
server with keep-alive and chunked SSE, small enough to out-run any Python client on one core.

Behaviour per request: wait `ttft_s`, then stream `max_tokens` (default `default_output_len`) tokens in chunks of
`tokens_per_chunk`, `itl_s` apart, echoing the prompt's words (so the first output word is the prompt's first
word: the random workload's request index), then a usage chunk if asked and `data: [DONE]`. `tokens_per_chunk > 1`
imitates speculative decoding, and `/metrics` exports matching `deepspec:spec_decode_*` counters.

Faults, for error tests: a prompt containing `__429__` gets HTTP 429, `__500__` HTTP 500, `__malformed__` a
non-JSON data line mid-stream, `__drop__` a connection closed mid-stream. `fault` applies one of them to every
request.

Not a library for production traffic: no TLS, no request validation beyond what the tests need.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

from loadtest.lifecycle import AsyncResource

FAULTS = ("429", "500", "malformed", "drop")


@dataclass
class FakeServerConfig:
    #: seconds from a parsed request to its first output chunk
    ttft_s: float = 0.0
    #: seconds between output chunks
    itl_s: float = 0.0
    #: output tokens when the request gives no max_tokens
    default_output_len: int = 16
    #: output tokens per streamed chunk; > 1 imitates speculative decoding (accepted = tokens_per_chunk - 1)
    tokens_per_chunk: int = 1
    #: draft length reported in the spec-decode counters
    num_speculative_tokens: int = 4
    #: one of FAULTS applied to every request, or None
    fault: str | None = None
    model: str = "fake-model"
    #: record (first prompt word, received, first chunk written, last byte written) perf_counter times per request
    record_timings: bool = False


@dataclass
class _Counters:
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_pos: dict[int, int] = field(default_factory=dict)
    requests: int = 0
    in_flight: int = 0
    #: most completion requests handled at once: shows whether a client capped its own concurrency
    max_in_flight: int = 0


class FakeOpenAIServer(AsyncResource):
    """`async with FakeOpenAIServer(cfg) as srv:` serves on 127.0.0.1:`srv.port` (0 = a free port)."""

    def __init__(self, config: FakeServerConfig | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.config = config or FakeServerConfig()
        self.host, self.port = host, port
        self.counters = _Counters()
        self.timings: list[tuple[str, float, float, float]] = []
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port, backlog=4096)
        self.port = self._server.sockets[0].getsockname()[1]

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            for w in list(self._writers):  # Server.close_clients() is Python 3.13+
                w.transport.abort()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                length = 0
                for h in lines[1:]:
                    if h[:15].lower() == "content-length:":
                        length = int(h[15:])
                body = await reader.readexactly(length) if length else b""
                if not await self._route(method, path, body, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _route(self, method: str, path: str, body: bytes, w: asyncio.StreamWriter) -> bool:
        """Answer one request; False closes the connection."""
        path = path.split("?", 1)[0]
        if method == "GET" and path == "/metrics":
            _respond(w, 200, self.metrics_text().encode(), "text/plain; version=0.0.4")
        elif method == "GET" and path == "/v1/models":
            _respond(
                w, 200, json.dumps({"object": "list", "data": [{"id": self.config.model, "object": "model"}]}).encode()
            )
        elif method == "GET" and path in ("/health", "/health/live", "/health/ready"):
            _respond(w, 200, b"{}")
        elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            return await self._complete(path.endswith("chat/completions"), json.loads(body), w)
        else:
            _respond(w, 404, b'{"error": {"message": "not found", "type": "not_found"}}')
        await w.drain()
        return True

    async def _complete(self, chat: bool, req: dict, w: asyncio.StreamWriter) -> bool:
        c = self.counters
        c.in_flight += 1
        c.max_in_flight = max(c.max_in_flight, c.in_flight)
        try:
            return await self._complete_one(chat, req, w)
        finally:
            c.in_flight -= 1

    async def _complete_one(self, chat: bool, req: dict, w: asyncio.StreamWriter) -> bool:
        t_recv = time.perf_counter()
        cfg = self.config
        prompt = req["messages"][-1]["content"] if chat else req["prompt"]
        fault = cfg.fault or next((f for f in FAULTS if f"__{f}__" in prompt), None)
        if fault in ("429", "500"):
            msg = "too many requests" if fault == "429" else "internal error"
            _respond(
                w,
                int(fault),
                json.dumps({"error": {"message": msg, "type": "fake", "code": int(fault)}}).encode(),
                extra=b"Retry-After: 1\r\n" if fault == "429" else b"",
            )
            await w.drain()
            return True
        words = prompt.split() or ["x"]
        n_out = int(req.get("max_tokens") or req.get("max_completion_tokens") or cfg.default_output_len)
        tokens = [words[i % len(words)] for i in range(n_out)]
        tpc = max(1, cfg.tokens_per_chunk)
        chunks = [" " + " ".join(tokens[i : i + tpc]) for i in range(0, n_out, tpc)]
        self._count(len(chunks), n_out)
        usage = {"prompt_tokens": len(words), "completion_tokens": n_out, "total_tokens": len(words) + n_out}
        rid = f"cmpl-{self.counters.requests}"
        if not req.get("stream"):
            if cfg.ttft_s or cfg.itl_s:
                await asyncio.sleep(cfg.ttft_s + cfg.itl_s * (len(chunks) - 1))
            text = "".join(chunks)
            choice = (
                {"index": 0, "message": {"role": "assistant", "content": text}} if chat else {"index": 0, "text": text}
            )
            choice["finish_reason"] = "length"
            _respond(w, 200, json.dumps({"id": rid, "model": cfg.model, "choices": [choice], "usage": usage}).encode())
            await w.drain()
            return True
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        if cfg.ttft_s:
            await asyncio.sleep(cfg.ttft_s)
        t_first = time.perf_counter()
        obj = "chat.completion.chunk" if chat else "text_completion"
        for i, text in enumerate(chunks):
            if i and cfg.itl_s:
                await asyncio.sleep(cfg.itl_s)
            if w.is_closing():  # the client went away mid-stream
                return False
            if fault == "malformed" and i == len(chunks) // 2:
                _chunk(w, b"data: {this is not json\n\n")
                continue
            if fault == "drop" and i == len(chunks) // 2:
                await w.drain()
                w.transport.abort()
                return False
            last = i == len(chunks) - 1
            choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
            choice["finish_reason"] = "length" if last else None
            _chunk(
                w,
                b"data: "
                + json.dumps({"id": rid, "object": obj, "model": cfg.model, "choices": [choice]}).encode()
                + b"\n\n",
            )
        if (req.get("stream_options") or {}).get("include_usage"):
            _chunk(
                w,
                b"data: "
                + json.dumps({"id": rid, "object": obj, "model": cfg.model, "choices": [], "usage": usage}).encode()
                + b"\n\n",
            )
        _chunk(w, b"data: [DONE]\n\n")
        w.write(b"0\r\n\r\n")
        await w.drain()
        if cfg.record_timings:
            self.timings.append((words[0], t_recv, t_first, time.perf_counter()))
        return True

    def _count(self, num_chunks: int, n_out: int) -> None:
        c, k = self.counters, self.config.num_speculative_tokens
        c.requests += 1
        accepted_per_step = max(0, self.config.tokens_per_chunk - 1)
        c.drafts += num_chunks
        c.draft_tokens += num_chunks * k
        c.accepted += num_chunks * accepted_per_step
        for pos in range(accepted_per_step):
            c.per_pos[pos] = c.per_pos.get(pos, 0) + num_chunks

    def metrics_text(self) -> str:
        """Prometheus text exposition of the spec-decode counters, labelled like the gateway's."""
        c, lbl = self.counters, f'model="{self.config.model}",worker="fake-0"'
        lines = []
        for name, value in (
            ("num_drafts", c.drafts),
            ("num_draft_tokens", c.draft_tokens),
            ("num_accepted_tokens", c.accepted),
        ):
            lines += [
                f"# TYPE deepspec:spec_decode_{name} counter",
                f"deepspec:spec_decode_{name}_total{{{lbl}}} {value}",
            ]
        lines.append("# TYPE deepspec:spec_decode_num_accepted_tokens_per_pos counter")
        for pos in range(self.config.num_speculative_tokens):
            series = f'deepspec:spec_decode_num_accepted_tokens_per_pos_total{{{lbl},position="{pos}"}}'
            lines.append(f"{series} {c.per_pos.get(pos, 0)}")
        return "\n".join(lines) + "\n"


def _respond(
    w: asyncio.StreamWriter, status: int, body: bytes, ctype: str = "application/json", extra: bytes = b""
) -> None:
    reason = {200: "OK", 404: "Not Found", 429: "Too Many Requests", 500: "Internal Server Error"}.get(status, "Error")
    w.write(
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n".encode()
        + extra
        + b"\r\n"
        + body
    )


def _chunk(w: asyncio.StreamWriter, data: bytes) -> None:
    w.write(b"%x\r\n%s\r\n" % (len(data), data))


async def serve_forever(config: FakeServerConfig, host: str, port: int, ready: asyncio.Event | None = None) -> None:
    async with FakeOpenAIServer(config, host, port):
        if ready is not None:
            ready.set()
        await asyncio.Event().wait()
