"""Which protocol a worker speaks, from its address: the one place a worker address becomes a client.

A worker is a KServe v2 gRPC server (DeepSpec's worker, Triton) or an OpenAI-compatible HTTP server (vLLM, SGLang,
trtllm-serve, llama.cpp). Both clients share one set of verbs (`is_ready`, `model_info`, `generate`, `infer`,
`close`) and raise `WorkerError`, so the pool and the dispatcher route, retry and eject them alike.

Address forms (the scheme picks the protocol; a bare `host:port` takes the pool's default, which is what DNS and
EndpointSlice discovery hand out):

    host:port                     the default protocol (`--worker-protocol`, kserve-grpc unless set)
    grpc://host:port              KServe v2 gRPC
    openai+http://host:port       OpenAI HTTP (also openai+https://)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Protocol = Literal["kserve-grpc", "openai-http"]

#: address scheme -> (protocol, URL scheme of the OpenAI base URL)
SCHEMES: dict[str, tuple[Protocol, str | None]] = {
    "grpc://": ("kserve-grpc", None),
    "openai+http://": ("openai-http", "http"),
    "openai+https://": ("openai-http", "https"),
}


@dataclass(frozen=True)
class WorkerAddress:
    protocol: Protocol
    #: host:port
    hostport: str
    #: for OpenAI workers, "http" or "https"
    url_scheme: str = "http"


def parse_address(address: str, default: Protocol = "kserve-grpc") -> WorkerAddress:
    """`address` as a protocol and `host:port`; ValueError naming the valid forms when it is neither."""
    protocol, url_scheme, rest = default, "http", address
    if "://" in address:
        scheme = address[: address.index("://") + 3]
        if scheme not in SCHEMES:
            raise ValueError(
                f"unknown worker scheme {scheme!r} in {address!r}: use host:port or one of {sorted(SCHEMES)}"
            )
        protocol, url_scheme = SCHEMES[scheme]
        rest = address[len(scheme) :]
    host, _, port = rest.rstrip("/").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"expected host:port after the scheme, got {address!r} in --workers")
    return WorkerAddress(protocol, f"{host}:{port}", url_scheme or "http")


def client_for(address: str, default: Protocol = "kserve-grpc", openai_max_outstanding: int = 0):
    """The client for one worker address; `address` stays its name (metrics, logs)."""
    parsed = parse_address(address, default)
    if parsed.protocol == "openai-http":
        from service.gateway.openai_client import OpenAIClient

        return OpenAIClient(address, f"{parsed.url_scheme}://{parsed.hostport}", max_outstanding=openai_max_outstanding)
    from service.gateway.worker_client import WorkerClient

    return WorkerClient(parsed.hostport)
