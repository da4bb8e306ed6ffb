"""Clients: one per wire protocol, all with the same verb, `send(RequestInput) -> RequestOutput`.

A client never raises for a failed request: it returns a `RequestOutput` with `success=False` and a short
`error_kind` ("connect", "timeout", "http_429", "malformed_sse", "grpc_unavailable", ...), so one bad
response is counted in the report instead of ending the run. Only `asyncio.CancelledError` escapes (Ctrl-C).

Each client owns one connection pool sized to the run's concurrency (`pool_size`; 0 = unbounded), opened in
`start()` inside the running event loop and closed by `aclose()`.
"""

from __future__ import annotations

import enum
from typing import Protocol

from loadtest.records import RequestInput, RequestOutput


class Backend(str, enum.Enum):
    """The values are the `--backend` strings (the first two as in `vllm bench serve`)."""

    OPENAI = "openai"  # POST /v1/completions
    OPENAI_CHAT = "openai-chat"  # POST /v1/chat/completions
    GRPC = "grpc"  # deepspec.v1.Completions


class Client(Protocol):
    async def start(self) -> None: ...

    async def send(self, req: RequestInput) -> RequestOutput: ...

    async def aclose(self) -> None: ...


def make_client(
    backend: Backend | str,
    *,
    base_url: str,
    grpc_address: str,
    model: str | None,
    stream: bool,
    pool_size: int,
    timeout_s: float,
    api_key: str | None = None,
) -> Client:
    """The client for `backend`; imports only that client's transport library."""
    try:
        backend = Backend(backend)
    except ValueError:
        raise ValueError(f"unknown backend {backend!r}; available: {[b.value for b in Backend]}") from None
    if backend is Backend.GRPC:
        from loadtest.clients.grpc import GrpcClient

        return GrpcClient(grpc_address, model=model, stream=stream, pool_size=pool_size, timeout_s=timeout_s)
    from loadtest.clients.openai_http import OpenAIHttpClient

    return OpenAIHttpClient(
        base_url,
        chat=backend is Backend.OPENAI_CHAT,
        model=model,
        stream=stream,
        pool_size=pool_size,
        timeout_s=timeout_s,
        api_key=api_key,
    )
