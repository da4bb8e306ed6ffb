"""Client for DeepSpec's own gRPC API, `deepspec.v1.Completions` (the gateway serves it next to HTTP).

`CompleteStream` chunks carry `num_tokens`, so output tokens are exact even when speculative decoding puts
several tokens in one chunk; the final chunk's `usage` wins when present. TTFT is the first chunk with text or
tokens; ITL is the gap between such chunks, as for HTTP.

One HTTP/2 connection multiplexes many streams, but servers cap concurrent streams per connection (gRPC's
usual default is 100), which would silently cap the run's concurrency. So the pool is several channels, one
connection each, with at most `STREAMS_PER_CHANNEL` requests assigned to each.

Failures become `grpc_<status>` error kinds (`grpc_unavailable` when the server is down,
`grpc_resource_exhausted` for backpressure, `grpc_deadline_exceeded` for timeouts).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time

import grpc

from deepspec_protocol.protos.deepspec.v1 import completions_pb2, completions_pb2_grpc
from loadtest.lifecycle import AsyncResource
from loadtest.records import RequestInput, RequestOutput

STREAMS_PER_CHANNEL = 64
CONNECT_TIMEOUT_S = 2.0


class GrpcClient(AsyncResource):
    def __init__(
        self, address: str, *, model: str | None, stream: bool = True, pool_size: int = 0, timeout_s: float = 600.0
    ) -> None:
        self.address = address
        self.model = model or ""
        self.stream = stream
        self.timeout_s = timeout_s
        self.num_channels = max(1, math.ceil(pool_size / STREAMS_PER_CHANNEL)) if pool_size else 4
        self._channels: list[grpc.aio.Channel] = []
        self._stubs: itertools.cycle | None = None

    async def start(self) -> None:
        # a local subchannel pool per channel, or grpc would share one connection between them.
        options = [("grpc.use_local_subchannel_pool", 1)]
        self._channels = [grpc.aio.insecure_channel(self.address, options=options) for _ in range(self.num_channels)]
        self._stubs = itertools.cycle([completions_pb2_grpc.CompletionsStub(c) for c in self._channels])
        # connect now, so the first requests' TTFT is not the TCP + HTTP/2 handshake; a server that is down is
        # not an error here: its requests will fail as grpc_unavailable and be counted.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(c.channel_ready() for c in self._channels)), CONNECT_TIMEOUT_S)

    async def aclose(self) -> None:
        for c in self._channels:
            await c.close()
        self._channels = []

    def build_request(self, req: RequestInput) -> completions_pb2.CompletionRequest:
        msg = completions_pb2.CompletionRequest(model=self.model, ignore_eos=req.ignore_eos)
        if req.messages:
            msg.messages.extend(completions_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in req.messages)
        else:
            msg.prompt = req.prompt
        if req.max_tokens is not None:
            msg.max_tokens = req.max_tokens
        if req.temperature is not None:
            msg.temperature = req.temperature
        return msg

    async def send(self, req: RequestInput) -> RequestOutput:
        assert self._stubs is not None, "call start() first"
        stub = next(self._stubs)
        out = RequestOutput(prompt_tokens=req.prompt_len or 0)
        msg = self.build_request(req)
        out.start_time = start = time.perf_counter()
        try:
            if self.stream:
                await self._read_stream(stub.CompleteStream(msg, timeout=self.timeout_s), out, start)
            else:
                resp = await stub.Complete(msg, timeout=self.timeout_s)
                out.e2e_s = out.ttft_s = time.perf_counter() - start
                out.generated_text = resp.text
                out.output_tokens = resp.usage.completion_tokens
                out.usage_reported = resp.HasField("usage")
                if resp.usage.prompt_tokens:
                    out.prompt_tokens = resp.usage.prompt_tokens
                out.success = True
        except grpc.aio.AioRpcError as e:
            out.error_kind, out.error = f"grpc_{e.code().name.lower()}", e.details() or ""
        return out

    async def _read_stream(self, call, out: RequestOutput, start: float) -> None:
        pieces: list[str] = []
        last = 0.0
        n_chunks = n_tokens = 0
        finished = False
        async for chunk in call:
            now = time.perf_counter()
            if chunk.text or chunk.num_tokens:
                if n_chunks == 0:
                    out.ttft_s = now - start
                else:
                    out.itl_s.append(now - last)
                last = now
                n_chunks += 1
                n_tokens += chunk.num_tokens
                pieces.append(chunk.text)
            if chunk.finish_reason:
                finished = True
            if chunk.HasField("usage"):
                out.output_tokens = chunk.usage.completion_tokens
                out.usage_reported = True
                if chunk.usage.prompt_tokens:
                    out.prompt_tokens = chunk.usage.prompt_tokens
        out.e2e_s = time.perf_counter() - start
        out.generated_text = "".join(pieces)
        if not out.usage_reported:
            out.output_tokens = n_tokens or n_chunks
        if not finished:
            out.error_kind, out.error = "incomplete_stream", "stream ended without a finish_reason"
        elif out.output_tokens == 0:
            out.error_kind, out.error = "empty_response", "the stream carried no output"
        else:
            out.success = True
