"""A worker that speaks OpenAI HTTP (vLLM, SGLang, trtllm-serve, llama.cpp's servers), behind the same verbs as the
KServe v2 `WorkerClient`: `is_ready`, `model_info`, `generate`, `infer`, `close`.

The dispatcher does not know which kind it talks to: this adapter turns a `GenerationRequest` into a
`/v1/completions` or `/v1/chat/completions` body, the engine's SSE chunks into `Chunk`s, and every failure into a
`WorkerError` whose `status` is the gRPC status name the dispatcher already acts on:

| upstream answer | status | dispatcher |
| --- | --- | --- |
| connection refused / reset, stream cut, other 5xx | UNAVAILABLE | eject, retry elsewhere before the first token |
| 429, 503 (the engine's queue is full or it is draining) | RESOURCE_EXHAUSTED | retry elsewhere, 429 when all are |
| 400, 422 (the engine refused the content) | INVALID_ARGUMENT | the client's 400, with the engine's message |
| 404 (the engine does not serve the model) | NOT_FOUND | retry elsewhere |
| 500 | INTERNAL | eject, retry elsewhere |
| the request deadline passes | DEADLINE_EXCEEDED | 504 |

Limits. One connection pool per upstream (`http_client.HttpPool`, HTTP/1.1 keep-alive on httptools) holds its
connections: the client is the largest part of what the gateway spends on a request, and this one costs a fraction
of aiohttp's (bench/openai_upstream.py). Closing a stream (client
disconnect, `Abort`, the deadline) closes its connection, which is how an OpenAI server learns to abort the
sequence: vLLM, SGLang and llama.cpp watch for the disconnect. Usage comes from the response (`usage`, asked for
with `stream_options.include_usage`); the engines put no drafted/accepted counts in their bodies, so a chunk's
spec-decode counts are 0 and the engine's own `/metrics` (scraped by Prometheus directly) carries them. An engine
that queues without bound never answers 429: `max_outstanding` caps the requests the gateway has in flight on one
upstream, and a request past it is refused as RESOURCE_EXHAUSTED before it is sent.

Structured outputs go as OpenAI's `response_format` (json_object, json_schema), which vLLM, SGLang and trtllm-serve
read, and regex, grammar and choice as vLLM's `structured_outputs` to a vLLM upstream only (its model cards say
`owned_by: "vllm"`); any other engine would drop that field unread, so such a request is refused (400) instead.

Logprobs go as OpenAI's fields (chat `logprobs` + `top_logprobs`, completions `logprobs`, with `echo` for the
prompt's) and come back as the worker's scores (`upstream_choices.py`), token ids unknown; a prompt given as token
ids goes as OpenAI's token-id `prompt` (vLLM, SGLang and trtllm-serve take it; llama.cpp's server answers 422). No
OpenAI server takes a logprobs mode per request (vLLM sets it per engine), so a request for processed logprobs is
refused by the dispatcher; `max_tokens` 0 (prompt scoring alone) goes to a vLLM upstream only, since llama.cpp's
server reads 0 as "no limit".

Speculation: a request's draft cap (`speculation`: off, or at most n draft tokens a round) goes to llama.cpp's
server as its per-request `speculative.n_max`; vLLM, SGLang and trtllm-serve fix the depth per server, so such a
request is refused (400) there, never sent and silently run at the server's depth. Without a cap nothing is sent.

Several choices go as OpenAI's `n`, and each upstream choice's `index` becomes its chunks' `Chunk.index`. The
upstream's usage covers every choice at once (OpenAI's shape has no per-choice counts), so the request's last chunk
carries it and the other choices' last chunks count 0: `total_stats` over them is the usage. An engine that answers
fewer choices than asked (one that ignores `n`) is refused (INVALID_ARGUMENT) rather than passed on short.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, Iterator

from deepspec_protocol import triton_contract as c
from deepspec_protocol import worker as p
from service.gateway.http_client import HttpPool, Response, UpstreamBroken
from service.gateway.json_codec import dumps, loads
from service.gateway.structured import response_format_field, structured_outputs_field
from service.gateway.upstream_choices import ChoiceReader
from service.gateway.worker_client import Chunk, GenerationRequest, WorkerError, merge_chunks

#: bytes one SSE line may hold: a chunk's logprobs can be long
MAX_EVENT_BYTES = 2**22
_DEADLINE_PASSED = "the upstream did not finish within the request timeout"
#: the engine's own readiness route (vLLM, SGLang, trtllm-serve)
HEALTH_PATH = "/health"
MODELS_PATH = "/v1/models"
_STATUS_FOR_HTTP = {
    400: "INVALID_ARGUMENT",
    422: "INVALID_ARGUMENT",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    503: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
}
#: keys of a model card that carry its context length (vLLM's `max_model_len`; llama.cpp and others' names)
_CONTEXT_KEYS = ("max_model_len", "context_length", "n_ctx", "max_context_length")
#: what vLLM's model cards say they are owned by (vllm/entrypoints/openai/engine/protocol.py ModelCard)
_VLLM_OWNER = "vllm"
#: what llama.cpp's server's model cards say (tools/server/server.cpp, the /v1/models handler)
_LLAMACPP_OWNER = "llamacpp"


def status_for_http(status_code: int) -> str:
    """The gRPC status name the dispatcher acts on for an upstream HTTP status."""
    return _STATUS_FOR_HTTP.get(status_code, "UNAVAILABLE" if status_code >= 500 else "INVALID_ARGUMENT")


def error_message(body: object, fallback: str) -> str:
    """The message of an OpenAI error body (`{"error": {"message"}}`, vLLM's older `{"object": "error", "message"}`
    or FastAPI's `{"detail"}`), else `fallback`."""
    if isinstance(body, dict):
        inner = body.get("error")
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        if isinstance(inner, str) and inner:
            return inner
        for key in ("message", "detail"):
            if body.get(key):
                return body[key] if isinstance(body[key], str) else json.dumps(body[key])
    return fallback


def request_body(req: GenerationRequest, stream: bool, vllm_extras: bool = False, llamacpp: bool = False) -> dict:
    """The OpenAI body for `req`. Unset fields are left out so the engine's default applies: `max_tokens` None
    (what fits), `top_k` 0 (SGLang refuses 0, llama.cpp reads it as the whole vocabulary). `vllm_extras`: the
    upstream is vLLM, which reads its `structured_outputs` extension; `llamacpp`: llama.cpp's server, which reads
    a per-request draft cap."""
    body: dict = {"model": req.model, "temperature": req.temperature, "top_p": req.top_p, "stream": stream}
    if req.messages is not None:
        body["messages"] = req.messages
    else:
        body["prompt"] = req.prompt_token_ids if req.prompt_token_ids is not None else req.prompt or ""
    if req.max_tokens == 0 and not vllm_extras:
        raise WorkerError(
            "INVALID_ARGUMENT",
            "max_tokens 0 (prompt scoring) is not supported by this worker: only a "
            "vLLM engine generates nothing for it (llama.cpp reads 0 as no limit); "
            "send max_tokens 1 and drop the last token",
        )
    if req.max_tokens is not None:
        body["max_tokens"] = req.max_tokens
    if req.top_k > 0:
        body["top_k"] = req.top_k
    if req.seed is not None:
        body["seed"] = req.seed
    if req.stop:
        body["stop"] = list(req.stop)
    if req.ignore_eos:
        body["ignore_eos"] = True  # vLLM's, SGLang's and TensorRT-LLM's field
        if req.max_tokens is not None:
            # the same promise in the field every engine reads: llama.cpp's Python server drops `ignore_eos` unread
            # (pydantic ignores unknown fields) but holds back the end-of-sequence token until `min_tokens`
            body["min_tokens"] = req.max_tokens
    if req.n > 1:
        body["n"] = req.n
    if req.max_draft_tokens is not None:
        body.update(_speculation_fields(req.max_draft_tokens, llamacpp))
    body.update(_logprobs_fields(req))
    if req.structured_output is not None:
        body.update(_constraint_fields(req.structured_output, vllm_extras))
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _speculation_fields(max_draft_tokens: int, llamacpp: bool) -> dict:
    """A request's draft cap in the upstream's own field. llama.cpp's server reads `speculative.n_max` from any
    completion body (tools/server/server.cpp `params_from_json_cmpl`; 0 leaves the slot without drafts) and is the
    only OpenAI server with a per-request cap: vLLM sets its depth per engine (`--speculative-config`), and so do
    SGLang and trtllm-serve. Elsewhere the request is refused rather than run at a depth it did not ask for."""
    if llamacpp:
        return {"speculative.n_max": max_draft_tokens, "speculative.n_min": 0}
    raise WorkerError(
        "INVALID_ARGUMENT",
        "per-request speculation control (speculation) is not supported by this "
        "worker: its engine (vLLM, SGLang or trtllm-serve) sets the speculation "
        "depth per server; leave `speculation` out, or route to a DeepSpec worker "
        "or a llama.cpp server",
    )


def _logprobs_fields(req: GenerationRequest) -> dict:
    """OpenAI's logprobs fields for `req`: chat's `logprobs` + `top_logprobs` (sent even at 0: llama.cpp's server
    scores nothing without it); completions' `logprobs` (one count for the prompt's table and the completion's, the
    larger; each keeps its own, `ChoiceReader`) and `echo` for the prompt's scores."""
    if req.messages is not None:
        return {} if req.logprobs is None else {"logprobs": True, "top_logprobs": req.logprobs}
    counts = [n for n in (req.logprobs, req.prompt_logprobs) if n is not None]
    fields = {"logprobs": max(counts)} if counts else {}
    if req.prompt_logprobs is not None:
        fields["echo"] = True
    return fields


def _constraint_fields(constraint: p.Constraint, vllm_extras: bool) -> dict:
    """The body fields that carry `constraint`: OpenAI's `response_format` for the JSON kinds (vLLM, SGLang and
    trtllm-serve read it), vLLM's `structured_outputs` for regex, grammar and choice where the upstream is vLLM;
    WorkerError INVALID_ARGUMENT where it is not, since another engine would drop the field unread."""
    try:
        response_format = response_format_field(constraint)
        if response_format is not None:
            return {"response_format": response_format}
        if vllm_extras:
            return {"structured_outputs": structured_outputs_field(constraint)}
    except ValueError as e:
        raise WorkerError("INVALID_ARGUMENT", str(e), "structured_output_invalid") from None
    raise WorkerError(
        "INVALID_ARGUMENT",
        f"{constraint.kind} structured outputs are not supported by this worker: an "
        "OpenAI-HTTP engine takes response_format (json_object, json_schema); "
        "regex, grammar and choice need a vLLM engine (structured_outputs)",
    )


def _stats(usage: object) -> p.RequestStats:
    if not isinstance(usage, dict):
        return p.RequestStats()
    return p.RequestStats(
        num_prompt_tokens=int(usage.get("prompt_tokens") or 0),
        num_output_tokens=int(usage.get("completion_tokens") or 0),
    )


def _last_chunks(held: dict[int, Chunk], seen: set[int], n: int, stats: p.RequestStats) -> list[Chunk]:
    """Each choice's last chunk (held back for its finish reason), in index order, the last of them final with the
    request's usage; WorkerError INVALID_ARGUMENT when the upstream answered fewer than the n choices asked."""
    if n > 1 and not set(range(n)) <= seen:
        raise WorkerError(
            "INVALID_ARGUMENT",
            f"several choices (n) are not supported by this worker: it answered "
            f"the choices {sorted(seen)} of the {n} asked",
        )
    chunks = [held.get(index) or Chunk("", index=index) for index in range(n)]
    chunks[-1].final, chunks[-1].stats = True, stats
    return chunks


def parse_event(data: bytes) -> dict:
    """One SSE `data:` payload as JSON (bytes that are not UTF-8 read with replacement characters); an error event
    (`{"error": ...}` or `{"object": "error"}`) as WorkerError."""
    try:
        event = loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        text = data.decode("utf-8", "replace")
        try:
            event = json.loads(text)
        except json.JSONDecodeError:
            raise WorkerError("INTERNAL", f"the upstream sent an event that is not JSON: {text[:200]!r}") from None
    if not isinstance(event, dict):
        text = data[:200].decode("utf-8", "replace")
        raise WorkerError("INTERNAL", f"the upstream sent an event that is not an object: {text!r}")
    if "error" in event or event.get("object") == "error":
        error = event.get("error")
        inner = error if isinstance(error, dict) else event
        code = inner.get("code")
        status = status_for_http(code) if isinstance(code, int) else "INTERNAL"
        raise WorkerError(status, error_message(event, "the upstream failed mid-stream"))
    return event


class EventStream:
    """One request's SSE answer, fed as its bytes arrive, read into Chunks. Chunks without text (the chat role
    chunk) are not passed on, so the first chunk the dispatcher sees is the first token; each choice's finish reason
    is held back until `[DONE]`, where it comes with the usage in the final chunk. An engine that ignores
    `stream_options` (llama.cpp's Python server) sends no usage: its completion tokens are then the chunks that
    carried text (it streams one token per chunk) and its prompt tokens stay 0, unknown."""

    def __init__(self, req: GenerationRequest):
        self.req, self.reader = req, ChoiceReader(req)
        #: `[DONE]` was read: the last chunks are out, anything after it is ignored
        self.done = False
        self._pending = b""  # the start of a line whose end has not arrived
        self._held: dict[int, Chunk] = {}  # choice -> its finishing chunk, sent with the usage at [DONE]
        self._seen: set[int] = set()  # the choices the upstream answered
        self._num_text_chunks, self._usage = 0, None

    def feed(self, data: bytes) -> Iterator[Chunk]:
        """The chunks that the complete lines of what has arrived so far (`data` the latest bytes) carry, in order."""
        lines = (self._pending + data).split(b"\n")
        self._pending = lines.pop()
        if len(self._pending) > MAX_EVENT_BYTES:
            raise WorkerError("INTERNAL", f"the upstream sent a line longer than {MAX_EVENT_BYTES} bytes")
        for line in lines:
            if not line.startswith(b"data:"):
                continue  # blank separators, comments (keep-alives), `event:` lines
            data = line[5:].strip()  # the line's \r too
            if data == b"[DONE]":
                self.done = True
                usage = self._usage
                stats = _stats(usage) if usage else p.RequestStats(num_output_tokens=self._num_text_chunks)
                yield from _last_chunks(self._held, self._seen, self.req.n, stats)
                return
            yield from self._chunks(parse_event(data))

    def _chunks(self, event: dict) -> Iterator[Chunk]:
        self._usage = event.get("usage") or self._usage
        for choice in event.get("choices") or ():
            chunk = self.reader.chunk(choice)
            self._num_text_chunks += bool(chunk.text)
            self._seen.add(chunk.index)
            if choice.get("finish_reason"):
                if chunk.index in self._held:
                    chunk = merge_chunks([self._held[chunk.index], chunk])
                chunk.finish_reason = choice["finish_reason"]
                self._held[chunk.index] = chunk
            elif (chunk.text or chunk.logprobs or chunk.prompt_logprobs) and chunk.index not in self._held:
                yield chunk


class OpenAIClient:
    """One OpenAI-compatible upstream at `base_url` (`http://host:port`); `address` is its name in metrics."""

    #: what this client forwards (GenerationRequest.extensions): all but a logprobs mode, which OpenAI's API lacks
    #: and vLLM sets per engine only (--logprobs-mode); constraints as `_constraint_fields` says
    extensions = frozenset(c.FEATURE_OF_ROLE.values()) - {c.FEATURE_OF_ROLE["logprobs_mode"]}

    def __init__(self, address: str, base_url: str, max_outstanding: int = 0, max_connections: int = 256):
        self.address = address
        self.base_url = base_url.rstrip("/")
        #: requests this gateway may have in flight on the upstream at once (0 = no cap)
        self.max_outstanding = max_outstanding
        self.num_outstanding = 0
        #: the upstream is vLLM (its model cards say so), which also reads vLLM's `structured_outputs`
        self.vllm_extras = False
        #: the upstream is llama.cpp's server (its model cards say so), which takes a per-request draft cap
        self.llamacpp = False
        self.max_connections = max_connections
        self._pool: HttpPool | None = None

    @property
    def pool(self) -> HttpPool:
        """Made on first use, inside the event loop that serves the gateway (a pool belongs to one loop, so a call
        from another loop gets a pool of its own)."""
        loop = asyncio.get_running_loop()
        if self._pool is None or self._pool.closed or self._pool.loop is not loop:
            self._pool = HttpPool.for_url(self.base_url, max_connections=self.max_connections)
        return self._pool

    # -- health -------------------------------------------------------------------------------------------------

    async def is_ready(self, timeout_s: float) -> bool:
        """The engine's `/health` answers 200 (vLLM, SGLang and trtllm-serve answer 503 or nothing while their
        engine is down). A server without that route (404: llama.cpp's Python server) is ready while it answers
        HTTP at all: its `/v1/models` waits for the model lock behind a running generation, so probing it would
        eject a busy server. A refused connection raises WorkerError UNAVAILABLE, so the pool ejects at once."""
        try:
            response = await self.pool.request("GET", HEALTH_PATH, timeout_s=timeout_s)
            try:
                await response.read()
            finally:
                response.release()
            return response.status in (200, 404)
        except OSError as e:  # TimeoutError among them
            raise WorkerError("UNAVAILABLE", f"{type(e).__name__}: {e}") from None

    async def model_info(self, timeout_s: float) -> dict[str, int]:
        """Models the upstream lists at `/v1/models` -> their context length (0 when the card does not say)."""
        try:
            response = await self.pool.request("GET", MODELS_PATH, timeout_s=timeout_s)
            try:
                data = await response.read()
            finally:
                response.release()
            cards = json.loads(data).get("data", []) if response.status == 200 else []
        except (OSError, ValueError, AttributeError) as e:  # TimeoutError among the OSErrors
            raise WorkerError("UNAVAILABLE", f"{MODELS_PATH}: {e}") from None
        models = {}
        owners = {card.get("owned_by") for card in cards if isinstance(card, dict)}
        self.vllm_extras, self.llamacpp = _VLLM_OWNER in owners, _LLAMACPP_OWNER in owners
        for card in cards:
            if isinstance(card, dict) and card.get("id"):
                models[card["id"]] = next((int(card[k]) for k in _CONTEXT_KEYS if isinstance(card.get(k), int)), 0)
        return models

    # -- generation ---------------------------------------------------------------------------------------------

    async def generate(self, req: GenerationRequest, timeout_s: float) -> AsyncGenerator[Chunk, None]:
        """Stream one request (`EventStream` says what becomes of the upstream's events). Reads take whatever has
        arrived, however many events that holds, rather than awaiting once per line."""
        with self._slot():
            response = await self._send(req, stream=True, timeout_s=timeout_s)
            stream = EventStream(req)
            try:
                async for data in response.pieces():
                    for chunk in stream.feed(data):
                        yield chunk
                    if stream.done:
                        return
                for chunk in stream.feed(b"\n"):  # the body's last line, if the upstream left it unended
                    yield chunk
                if not stream.done:
                    raise WorkerError("UNAVAILABLE", "the upstream closed the stream before [DONE]")
            except TimeoutError:  # first: a TimeoutError is an OSError too
                raise WorkerError("DEADLINE_EXCEEDED", _DEADLINE_PASSED) from None
            except UpstreamBroken as e:
                raise WorkerError("UNAVAILABLE", f"the upstream stream broke: {e}") from None
            finally:
                if stream.done:  # a finished stream gives its connection back
                    response.release()
                else:  # an unfinished one closes it: the engine aborts the sequence
                    response.close()

    async def takes_n(self, model: str, timeout_s: float) -> bool:
        """Every OpenAI server is sent `n` as it is (OpenAI's field); one that answers fewer choices is refused."""
        return True

    async def infer(self, req: GenerationRequest, timeout_s: float) -> AsyncGenerator[Chunk, None]:
        """A whole completion, yielded as one chunk per choice, the last one final."""
        with self._slot():
            response = await self._send(req, stream=False, timeout_s=timeout_s)
            try:
                body = loads(await response.read())
            except TimeoutError:
                raise WorkerError("DEADLINE_EXCEEDED", _DEADLINE_PASSED) from None
            except UpstreamBroken as e:
                raise WorkerError("UNAVAILABLE", f"the upstream broke off: {e}") from None
            except json.JSONDecodeError:
                raise WorkerError("INTERNAL", "the upstream answered a body that is not JSON") from None
            finally:
                response.release()
        reader, held = ChoiceReader(req), {}
        for choice in body.get("choices") or [{}]:
            chunk = reader.chunk(choice)
            chunk.finish_reason = choice.get("finish_reason")
            held[chunk.index] = chunk
        for chunk in _last_chunks(held, set(held), req.n, _stats(body.get("usage"))):
            yield chunk

    async def _send(self, req: GenerationRequest, stream: bool, timeout_s: float) -> Response:
        """POST the request and return the open response once its status is 200; any other status as WorkerError.
        `timeout_s` bounds the whole request, reading the answer included: past it, an await on the response raises
        TimeoutError."""
        path = "/v1/chat/completions" if req.messages is not None else "/v1/completions"
        body = dumps(request_body(req, stream, self.vllm_extras, self.llamacpp))
        try:
            response = await self.pool.request("POST", path, body, "application/json", timeout_s)
        except TimeoutError:  # first: a TimeoutError is an OSError too
            raise WorkerError("DEADLINE_EXCEEDED", _DEADLINE_PASSED) from None
        except OSError as e:  # UpstreamConnectError, UpstreamBroken
            raise WorkerError("UNAVAILABLE", f"{type(e).__name__}: {e}") from None
        if response.status == 200:
            return response
        try:
            body = json.loads(await response.read())
        except TimeoutError:
            raise WorkerError("DEADLINE_EXCEEDED", _DEADLINE_PASSED) from None
        except (OSError, ValueError):
            body = None
        finally:
            response.release()
        message = error_message(body, f"HTTP {response.status}")
        raise WorkerError(status_for_http(response.status), f"{message} (upstream HTTP {response.status})")

    @contextlib.contextmanager
    def _slot(self):
        """Count one request in flight on this upstream; RESOURCE_EXHAUSTED past `max_outstanding`."""
        if self.max_outstanding and self.num_outstanding >= self.max_outstanding:
            raise WorkerError(
                "RESOURCE_EXHAUSTED", f"{self.max_outstanding} requests already in flight on {self.address}"
            )
        self.num_outstanding += 1
        try:
            yield
        finally:
            self.num_outstanding -= 1

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
