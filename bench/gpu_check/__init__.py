"""`make gpu-check`: one prepared script for a machine with one NVIDIA GPU, ≤ 8 minutes, that prints a table and
writes JSON (bench/results/gpu_check.json, or --out).

Parts, each in a process of its own so one failing, crashing or hanging costs its own rows only:

- `kernels`: every plugin kernel compiled by the installed triton for this GPU's arch, then every kernel against
  the CPU reference (`python -m plugins check`'s cases, with timings);
- `engine`: our engine on CUDA with every drafter — prompt lookup, a corpus-lookup index, random Eagle3, DFlash
  and DSpark drafts, chains and trees, a hybrid — greedy output identical to target-only in fp32, temperature 1
  finishing, the verification running as Triton kernels, and bf16 tok/s at batch 1 beside Hugging Face
  `generate` on the same GPU;
- `training`: 20 optimizer steps of each algorithm on CUDA through the real Trainer;
- `onnx`: the target's ONNX export run by ONNX Runtime's CUDA provider where the build has one (else `skipped`,
  and the CPU provider still checks the graph);
- `tensorrt`: the installed triton's greedy_accept PTX against TensorRT's AOT launch contract, then a one-node
  TensorRT engine with the `deepspec::greedy_accept` plugin built, run and compared with the reference (where
  `tensorrt` imports; issue 42 item 10);
- `vllm`: a Qwen3-style (q/k-norm) EAGLE-3 draft exported in the speculators format, then served by vLLM with the
  draft proposing (where `vllm` imports; issue 42 item 11).

The target is built in process: SmolLM2-135M's shapes (30 layers, hidden 576, 9 heads, 3 kv heads, vocab 49152)
with seeded random weights, saved as a Hugging Face directory and loaded through `load_target` — speed is a
property of the shapes, greedy identity holds for any weights, and nothing has to travel or be downloaded.

It runs on the GPU machine's own Python stack (torch, triton, transformers, onnx, onnxruntime, tokenizers,
safetensors, numpy, pyyaml), with no network. Each part checks its imports first and reads `skipped: missing
modules ...` when one is absent. What that stack lacks and training needs (pydantic and its dependencies) is
downloaded beforehand, where there is network, by `make gpu-wheels` into `.whl/` (py3.12 manylinux wheels);
the check installs those offline with `pip install --no-index --no-deps --target build/gpu-check-site` (only a
wheel whose package is missing or older there) and puts that directory first on the path. `make gpu-check`
itself only pip-installs this package, with --no-deps and no index.

The device command (carry `.whl`; GPU_PYTHON is the machine's Python with torch):

    make gpu-wheels                                               # here, once: pydantic & co. into .whl/
    make gpu-check GPU_PYTHON=/opt/torch/.venv/bin/python3 GPU_CHECK_ARGS="--out $OUT/gpu_check.json"
    /opt/torch/.venv/bin/python3 -m bench.gpu_check --out $OUT/gpu_check.json    # the same without make

On a CPU: `python -m bench.gpu_check --device cpu --quick` runs every part at tiny sizes in well under a minute
(what tests/bench/test_gpu_check.py runs); the Triton kernels then only compile (one of them), as a GPU is needed
to launch them.
"""
