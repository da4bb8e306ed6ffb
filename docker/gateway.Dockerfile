# syntax=docker/dockerfile:1.7
# DeepSpec gateway: OpenAI-compatible HTTP (:8000) and gRPC (:50051) API in front of KServe v2 workers, with its
# Prometheus /metrics on a port of its own (:8002), away from the API and any Ingress in front of it.
# No torch and no model code runs here: the gateway only routes. It installs the deepspec wheel and the locked
# dependency set docker/locks/gateway.txt, never the source tree. Build with `make images` (docker/README.md), which
# assembles the build context: the wheel under dist/, the locks under locks/, healthcheck.py, optional certs/.
#
#   make images IMAGES=gateway
#   docker run --rm -p 8000:8000 ghcr.io/deepspec/gateway:0.1.0 gateway --workers host.docker.internal:8001
#
# Pin the base by digest in release builds: --build-arg PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:<digest>
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
# The image context (make images): locks/, wheels/ (wheels offered besides the index), certs/ (a CA bundle where a
# proxy re-signs TLS), dist/ (the deepspec wheel), healthcheck.py. The dependencies go first: their layer stays
# cached while only the wheel changes.
COPY locks/ /build/locks/
COPY wheels/ /build/wheels/
COPY certs/ /build/certs/
# Every package pinned, --no-deps: nothing to resolve; pip check proves the set consistent.
RUN python -m venv /opt/venv \
    && cert="$(find /build/certs -name '*.crt' -print -quit)" \
    && pip install ${cert:+--cert "$cert"} --no-deps --find-links /build/wheels --requirement /build/locks/gateway.txt \
    && pip check
# --no-deps again: the wheel's torch requirement is the worker's, not the gateway's
COPY dist/ /build/dist/
COPY healthcheck.py /build/
RUN pip install --no-deps --no-index /build/dist/deepspec-*.whl \
    && find /opt/venv -name __pycache__ -prune -exec rm -rf {} +

FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 deepspec \
    && useradd --system --uid 10001 --gid deepspec --home-dir /cache --no-create-home --shell /usr/sbin/nologin deepspec \
    && mkdir -p /cache \
    && chown deepspec:deepspec /cache
COPY --from=builder /opt/venv /opt/venv
COPY --from=builder /build/healthcheck.py /usr/local/bin/deepspec-healthcheck
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/cache
WORKDIR /cache
USER 10001:10001
# Labels last: CREATED and REVISION change every build, and the layers above stay cached.
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
ARG PYTHON_IMAGE
LABEL org.opencontainers.image.title="deepspec-gateway" \
      org.opencontainers.image.description="DeepSpec gateway: OpenAI-compatible HTTP and gRPC API routing to speculative-decoding workers" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="https://github.com/deepspec/deepspec" \
      org.opencontainers.image.licenses="MIT" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
EXPOSE 8000 50051 8002
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "/usr/local/bin/deepspec-healthcheck", "http://127.0.0.1:8000/health/live"]
ENTRYPOINT ["python", "-m", "service"]
CMD ["gateway", "--workers", "dns://deepspec-worker:8001", "--http-port", "8000", "--grpc-port", "50051", "--metrics-port", "8002"]
