# syntax=docker/dockerfile:1.7
# DeepSpec gateway: OpenAI-compatible HTTP (:8000) and gRPC (:50051) API in front of KServe v2 workers, with its
# Prometheus /metrics on a port of its own (:8002), away from the API and any Ingress in front of it.
# No torch and no model code: the gateway only routes. Build from the repository root:
#
#   docker build -f docker/gateway.Dockerfile -t ghcr.io/deepspec/gateway:0.1.0 .
#   docker run --rm -p 8000:8000 ghcr.io/deepspec/gateway:0.1.0 gateway --workers host.docker.internal:8001
#
# Pin the base by digest in release builds: --build-arg PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:<digest>
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
WORKDIR /src
RUN python -m venv /opt/venv
# Dependencies first: this layer is rebuilt only when pyproject.toml changes.
COPY pyproject.toml ./
COPY docker/requirements.py docker/
RUN python docker/requirements.py --extras serve \
        --exclude torch transformers gguf accelerate safetensors > requirements.txt \
    && pip install --requirement requirements.txt \
    && find /opt/venv -name __pycache__ -prune -exec rm -rf {} +

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="deepspec-gateway" \
      org.opencontainers.image.description="DeepSpec gateway: OpenAI-compatible HTTP and gRPC API routing to speculative-decoding workers" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="https://github.com/deepspec/deepspec" \
      org.opencontainers.image.licenses="MIT" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
RUN groupadd --system --gid 10001 deepspec \
    && useradd --system --uid 10001 --gid deepspec --home-dir /cache --no-create-home --shell /usr/sbin/nologin deepspec \
    && mkdir -p /cache \
    && chown deepspec:deepspec /cache
COPY --from=builder /opt/venv /opt/venv
COPY service /app/service
COPY docker/healthcheck.py /usr/local/bin/deepspec-healthcheck
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/app \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/cache
WORKDIR /app
USER 10001:10001
EXPOSE 8000 50051 8002
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "/usr/local/bin/deepspec-healthcheck", "http://127.0.0.1:8000/health/live"]
ENTRYPOINT ["python", "-m", "service"]
CMD ["gateway", "--workers", "dns://deepspec-worker:8001", "--http-port", "8000", "--grpc-port", "50051", "--metrics-port", "8002"]
