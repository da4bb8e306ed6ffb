"""Container HEALTHCHECK for the DeepSpec images: exit 0 when the server answers healthy, 1 otherwise.

    deepspec-healthcheck http://127.0.0.1:8000/health/live    # gateway: HTTP 2xx
    deepspec-healthcheck grpc://127.0.0.1:8001                # worker: grpc.health.v1 Check == SERVING

Kubernetes ignores HEALTHCHECK (the chart's probes do this job there); it serves `docker run` and Compose.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

TIMEOUT_S = 3.0


def check_http(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError):
        return False


def check_grpc(address: str) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            # the grpcio-health-checking stubs bundled with pyright declare none of HealthStub's methods
            reply = health_pb2_grpc.HealthStub(channel).Check(  # pyright: ignore[reportAttributeAccessIssue]
                health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT_S
            )
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[1].startswith(("http://", "https://", "grpc://")):
        print("usage: deepspec-healthcheck http://HOST:PORT/PATH | grpc://HOST:PORT", file=sys.stderr)
        return 2
    target = argv[1]
    healthy = check_grpc(target.removeprefix("grpc://")) if target.startswith("grpc://") else check_http(target)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
