"""OpenAI-compatible HTTP client (`/v1/completions`, `/v1/chat/completions`) on aiohttp.

Why aiohttp: at 500+ streamed requests/s on one core the client's own cost per request must stay well under
1 ms; httpx spends several times more CPU per streamed response (bench/loadtest_overhead.py measures both).

Streaming reads Server-Sent Events line by line and timestamps each `data:` line as it arrives: the first
one carrying text sets TTFT, later ones add an ITL gap. `stream_options.include_usage` asks the server for a
final usage chunk so output tokens are the server's count; without it the number of text-carrying chunks is
used (exact for servers that stream one token per chunk, an undercount under speculative decoding).

Failures become `error_kind`s: `connect` (server down / refused), `timeout`, `http_<status>` (e.g. `http_429`),
`disconnected` (connection dropped mid-response), `malformed_sse` (a data line that is not JSON),
`stream_error` (an `error` object inside the stream), `incomplete_stream` (ended without `[DONE]` or a
finish reason), `empty_response` (no output text and no tokens).
"""

from __future__ import annotations

import json
import time

import aiohttp

from loadtest.lifecycle import AsyncResource
from loadtest.records import RequestInput, RequestOutput

_MAX_ERROR_BODY = 500
_decode = json.JSONDecoder().decode


class OpenAIHttpClient(AsyncResource):
    def __init__(
        self,
        base_url: str,
        *,
        chat: bool,
        model: str | None,
        stream: bool = True,
        pool_size: int = 0,
        timeout_s: float = 600.0,
        api_key: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.chat = chat
        self.url = self.base_url + ("/v1/chat/completions" if chat else "/v1/completions")
        self.model = model
        self.stream = stream
        self.pool_size = pool_size
        self.timeout_s = timeout_s
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        # limit=pool_size: the pool is exactly the run's concurrency (aiohttp's default silently caps at 100).
        connector = aiohttp.TCPConnector(limit=self.pool_size, limit_per_host=0, ttl_dns_cache=None)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            # responses are parsed by hand; skipping aiohttp's cookie jar and auto-decompression saves CPU.
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def build_body(self, req: RequestInput) -> dict:
        body: dict = {}
        if self.model:
            body["model"] = self.model
        if self.chat:
            body["messages"] = req.messages or [{"role": "user", "content": req.prompt}]
        else:
            body["prompt"] = req.prompt
        if req.max_tokens is not None:
            body["max_tokens"] = req.max_tokens
        if req.temperature is not None:
            body["temperature"] = req.temperature
        if req.ignore_eos:
            body["ignore_eos"] = True
        if self.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    async def send(self, req: RequestInput) -> RequestOutput:
        assert self._session is not None, "call start() first"
        out = RequestOutput(prompt_tokens=req.prompt_len or 0)
        data = json.dumps(self.build_body(req)).encode()
        out.start_time = start = time.perf_counter()
        try:
            async with self._session.post(self.url, data=data, headers=self.headers) as resp:
                if resp.status != 200:
                    text = (await resp.text(errors="replace"))[:_MAX_ERROR_BODY]
                    out.error_kind, out.error = f"http_{resp.status}", text
                    return out
                if self.stream:
                    await self._read_stream(resp, out, start)
                else:
                    await self._read_whole(resp, out, start)
        except TimeoutError:
            out.error_kind, out.error = "timeout", f"no complete response within {self.timeout_s:g} s"
        except aiohttp.ClientConnectorError as e:
            out.error_kind, out.error = "connect", str(e)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as e:
            out.error_kind, out.error = "disconnected", str(e) or type(e).__name__
        except aiohttp.ClientError as e:
            out.error_kind, out.error = "client_error", f"{type(e).__name__}: {e}"
        return out

    async def _read_stream(self, resp: aiohttp.ClientResponse, out: RequestOutput, start: float) -> None:
        chat = self.chat
        pieces: list[str] = []
        itl = out.itl_s
        last = 0.0
        n_chunks = 0
        done = finished = False
        tail = b""
        # Read whatever the socket has and split lines here: one await per network read instead of one per SSE
        # line (half of them blank) halves the client's CPU per request, and no line is too long for a buffer.
        # Events that arrive in the same read get the same timestamp, which is when the client saw them.
        async for data in resp.content.iter_any():
            now = time.perf_counter()
            lines = (tail + data).split(b"\n") if tail else data.split(b"\n")
            tail = lines.pop()
            for raw in lines:
                if not raw.startswith(b"data:"):
                    continue  # blank separators, `: keep-alive` comments, `event:` lines
                payload = raw[5:].strip()
                if payload == b"[DONE]":
                    done = True  # keep reading to the end of the body, so the connection can be reused
                    continue
                try:
                    chunk = _decode(payload.decode())  # str in: json.loads(bytes) first sniffs the encoding
                except ValueError:
                    out.error_kind, out.error = "malformed_sse", f"not JSON: {payload[:200]!r}"
                    return
                if not isinstance(chunk, dict):
                    out.error_kind, out.error = "malformed_sse", f"not a JSON object: {payload[:200]!r}"
                    return
                if "error" in chunk:
                    out.error_kind, out.error = "stream_error", json.dumps(chunk["error"])[:_MAX_ERROR_BODY]
                    return
                choices = chunk.get("choices")
                if choices:
                    choice = choices[0]
                    text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                    if text:
                        if n_chunks == 0:
                            out.ttft_s = now - start
                        else:
                            itl.append(now - last)
                        last = now
                        n_chunks += 1
                        pieces.append(text)
                    if choice.get("finish_reason"):
                        finished = True
                usage = chunk.get("usage")
                if usage:
                    _apply_usage(out, usage)
        if tail.strip() == b"data: [DONE]":  # a body that ends without the final newline
            done = True
        out.e2e_s = time.perf_counter() - start
        out.generated_text = "".join(pieces)
        if not out.usage_reported:
            out.output_tokens = n_chunks
        if not (done or finished):
            out.error_kind, out.error = "incomplete_stream", "stream ended without [DONE] or a finish_reason"
        elif n_chunks == 0 and out.output_tokens == 0:
            out.error_kind, out.error = "empty_response", "the stream carried no output text"
        else:
            out.success = True

    async def _read_whole(self, resp: aiohttp.ClientResponse, out: RequestOutput, start: float) -> None:
        try:
            body = json.loads(await resp.read())
            choice = body["choices"][0]
            text = choice["message"]["content"] if self.chat else choice["text"]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            out.error_kind, out.error = "malformed_response", f"{type(e).__name__}: {e}"
            return
        # without streaming the first token arrives with the last: TTFT is the whole latency.
        out.e2e_s = out.ttft_s = time.perf_counter() - start
        out.generated_text = text or ""
        if body.get("usage"):
            _apply_usage(out, body["usage"])
        else:
            out.output_tokens = 1 if out.generated_text else 0
        out.success = True


def _apply_usage(out: RequestOutput, usage: dict) -> None:
    if usage.get("completion_tokens") is not None:
        out.output_tokens = int(usage["completion_tokens"])
        out.usage_reported = True
    if usage.get("prompt_tokens"):
        out.prompt_tokens = int(usage["prompt_tokens"])


async def fetch_model_ids(base_url: str, timeout_s: float = 10.0, api_key: str | None = None) -> list[str]:
    """The ids from `GET /v1/models`, for picking a default `--model`."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s,
        s.get(base_url.rstrip("/") + "/v1/models", headers=headers) as resp,
    ):
        resp.raise_for_status()
        data = await resp.json(content_type=None)
    return [m["id"] for m in data.get("data", []) if "id" in m]
