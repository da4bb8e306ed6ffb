"""`--format triton-repo`: a Triton Inference Server model repository around TensorRT-LLM.

Two layouts, one directory:

- the repository root is TensorRT-LLM's LLM-API model (what `tritonserver --model-repository=OUT` serves, and what
  the chart's `worker.runtime: triton` points at): `tensorrt_llm/config.pbtxt` (Python backend, decoupled streaming)
  and `tensorrt_llm/1/model.yaml` (LLM kwargs: the target copied into `tensorrt_llm/1/target/`, backend pytorch,
  tensor_parallel_size, `speculative_config` naming the EAGLE-3 draft in `tensorrt_llm/1/draft/`, triton_config).
  Its `model.py` is ours (export/triton/llmapi_model.py): Triton's Python backend around `tensorrt_llm.LLM`, streaming
  text and reporting each request's acceptance counters.
- `tensorrt_llm/1/engine-repo/` is the <= 1.2 ensemble repository (`preprocessing`, `tensorrt_llm` on the
  `tensorrtllm` backend, `postprocessing`, `ensemble`) for an engine built by `--format tensorrt-llm`'s build.sh;
  serve it with `tritonserver --model-repository=OUT/tensorrt_llm/1/engine-repo`.

Every config.pbtxt parses into Triton's ModelConfig protobuf (tests do it with tritonclient's copy).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from export import snippets
from export.drafts.writers import check_draft, write_draft
from export.errors import ExportError
from export.triton import LLMAPI_MODEL_PY
from export.job import ExportFormat, ExportJob
from export.trtllm_checkpoint import ARCHITECTURES, check_sizes

ENGINE = "triton-repo"
MODEL = "tensorrt_llm"
MAX_BATCH_SIZE = 64
#: the <= 1.2 ensemble repository, inside the version directory: Triton treats every directory at the repository
#: root as a model (and --exit-on-error stops on one without config.pbtxt), and ignores what a version holds
ENSEMBLE_DIR = "engine-repo"
_TARGET_FILES = ("*.json", "*.safetensors", "*.model", "*.txt", "*.jinja")


def check(job: ExportJob) -> None:
    check_sizes(job.target.arch, job.tp)
    if job.draft is not None and job.draft.algo != "eagle3":
        raise ExportError(f"{ENGINE}: the TensorRT-LLM model runs EAGLE-3 drafts here; {job.draft.path.name} is "
                          f"{job.draft.algo}")
    check_draft("tensorrt-llm", job)


def _tensor(name: str, dtype: str, dims: str = "[ 1 ]", optional: bool = False) -> str:
    return (f'  {{\n    name: "{name}"\n    data_type: {dtype}\n    dims: {dims}'
            + ("\n    optional: true" if optional else "") + "\n  }")


def _io(kind: str, tensors: list[str]) -> str:
    return f"{kind} [\n" + ",\n".join(tensors) + "\n]\n"


LLMAPI_INPUTS = [_tensor("text_input", "TYPE_STRING"), _tensor("max_tokens", "TYPE_INT32", optional=True),
                 _tensor("temperature", "TYPE_FP32", optional=True), _tensor("top_p", "TYPE_FP32", optional=True),
                 _tensor("top_k", "TYPE_INT32", optional=True), _tensor("streaming", "TYPE_BOOL", optional=True),
                 _tensor("seed", "TYPE_UINT64", optional=True)]
LLMAPI_OUTPUTS = [_tensor("text_output", "TYPE_STRING", "[ -1 ]"), _tensor("finish_reason", "TYPE_STRING", "[ -1 ]"),
                  _tensor("acceptance_rate", "TYPE_FP32"), _tensor("total_accepted_draft_tokens", "TYPE_INT32"),
                  _tensor("total_draft_tokens", "TYPE_INT32")]


def llmapi_config_pbtxt(job: ExportJob) -> str:
    return (f'name: "{MODEL}"\nbackend: "python"\nmax_batch_size: 0\n'
            "model_transaction_policy {\n  decoupled: true\n}\n"
            + _io("input", LLMAPI_INPUTS) + _io("output", LLMAPI_OUTPUTS)
            + "instance_group [\n  {\n    count: 1\n    kind: KIND_MODEL\n  }\n]\n")


def ensemble_configs(job: ExportJob) -> dict[str, str]:
    """The <= 1.2 ensemble: model name -> config.pbtxt."""
    tokenizer = "${tokenizer_dir}"
    text_in, ids = _tensor("text_input", "TYPE_STRING", "[ 1 ]"), _tensor("input_ids", "TYPE_INT32", "[ -1 ]")
    pre = (f'name: "preprocessing"\nbackend: "python"\nmax_batch_size: {MAX_BATCH_SIZE}\n'
           + _io("input", [_tensor("QUERY", "TYPE_STRING"), _tensor("REQUEST_OUTPUT_LEN", "TYPE_INT32")])
           + _io("output", [_tensor("INPUT_ID", "TYPE_INT32", "[ -1 ]"), _tensor("REQUEST_INPUT_LEN", "TYPE_INT32"),
                            _tensor("REQUEST_OUTPUT_LEN", "TYPE_INT32")])
           + f'parameters {{\n  key: "tokenizer_dir"\n  value: {{ string_value: "{tokenizer}" }}\n}}\n')
    engine = (f'name: "tensorrt_llm"\nbackend: "tensorrtllm"\nmax_batch_size: {MAX_BATCH_SIZE}\n'
              "model_transaction_policy {\n  decoupled: true\n}\n"
              + _io("input", [ids, _tensor("input_lengths", "TYPE_INT32"),
                              _tensor("request_output_len", "TYPE_INT32"),
                              _tensor("draft_input_ids", "TYPE_INT32", "[ -1 ]", optional=True)])
              + _io("output", [_tensor("output_ids", "TYPE_INT32", "[ -1, -1 ]"),
                               _tensor("sequence_length", "TYPE_INT32", "[ -1 ]")])
              + 'parameters {\n  key: "gpt_model_path"\n  value: { string_value: "${engine_dir}" }\n}\n'
              + 'parameters {\n  key: "batching_strategy"\n  value: { string_value: "inflight_fused_batching" }\n}\n'
              + f'parameters {{\n  key: "max_draft_len"\n  value: {{ string_value: "{job.num_speculative_tokens}" }}\n}}\n')
    post = (f'name: "postprocessing"\nbackend: "python"\nmax_batch_size: {MAX_BATCH_SIZE}\n'
            + _io("input", [_tensor("TOKENS_BATCH", "TYPE_INT32", "[ -1, -1 ]"),
                            _tensor("SEQUENCE_LENGTH", "TYPE_INT32", "[ -1 ]")])
            + _io("output", [_tensor("OUTPUT", "TYPE_STRING", "[ -1 ]")])
            + f'parameters {{\n  key: "tokenizer_dir"\n  value: {{ string_value: "{tokenizer}" }}\n}}\n')
    ensemble = (f'name: "ensemble"\nplatform: "ensemble"\nmax_batch_size: {MAX_BATCH_SIZE}\n'
                + _io("input", [text_in, _tensor("max_tokens", "TYPE_INT32")])
                + _io("output", [_tensor("text_output", "TYPE_STRING", "[ -1 ]")])
                + "ensemble_scheduling {\n"
                + _step("preprocessing", {"QUERY": "text_input", "REQUEST_OUTPUT_LEN": "max_tokens"},
                        {"INPUT_ID": "_INPUT_ID", "REQUEST_INPUT_LEN": "_REQUEST_INPUT_LEN",
                         "REQUEST_OUTPUT_LEN": "_REQUEST_OUTPUT_LEN"})
                + ",\n"
                + _step("tensorrt_llm", {"input_ids": "_INPUT_ID", "input_lengths": "_REQUEST_INPUT_LEN",
                                         "request_output_len": "_REQUEST_OUTPUT_LEN"},
                        {"output_ids": "_TOKENS_BATCH", "sequence_length": "_SEQUENCE_LENGTH"})
                + ",\n"
                + _step("postprocessing", {"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH"},
                        {"OUTPUT": "text_output"})
                + "\n}\n")
    return {"preprocessing": pre, "tensorrt_llm": engine, "postprocessing": post, "ensemble": ensemble}


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    def maps(kind, m):
        return "".join(f'    {kind} {{\n      key: "{k}"\n      value: "{v}"\n    }}\n' for k, v in m.items())

    return (f'  step {{\n    model_name: "{model}"\n    model_version: -1\n'
            + maps("input_map", inputs) + maps("output_map", outputs) + "  }")


def write(job: ExportJob, out: Path, progress) -> dict:
    version = out / MODEL / "1"
    version.mkdir(parents=True)
    (out / MODEL / "config.pbtxt").write_text(llmapi_config_pbtxt(job))
    files = sorted({p for pattern in _TARGET_FILES for p in job.target.path.glob(pattern)})
    with progress.task("copying the target", total=len(files)) as advance:
        (version / "target").mkdir()
        for f in files:
            shutil.copy2(f, version / "target" / f.name)
            advance(1)
    fields = {"tp": job.tp, "model_name": MODEL, "architecture": ARCHITECTURES[job.target.family]}
    final = job.options.get("final_out") or out
    draft_dir = None
    if job.draft is not None:
        fields.update(write_draft("tensorrt-llm", job, version / "draft"))
        draft_dir = str(Path(final).resolve() / MODEL / "1" / "draft")
        fields["draft"] = f"{MODEL}/1/draft"
    llm = {"model": str(Path(final).resolve() / MODEL / "1" / "target"),
           **snippets.trtllm_llm_args(job, draft_dir, ""),
           "triton_config": {"max_batch_size": 0, "decoupled": True}}
    (version / "model.yaml").write_text(yaml.safe_dump(llm, sort_keys=False))
    shutil.copy2(LLMAPI_MODEL_PY, version / "model.py")
    for name, text in ensemble_configs(job).items():
        (version / ENSEMBLE_DIR / name / "1").mkdir(parents=True)
        (version / ENSEMBLE_DIR / name / "config.pbtxt").write_text(text)
    serve = "tritonserver --model-repository=OUT"
    snippets.write_readme(out, "Triton model repository (TensorRT-LLM)", f"Target `{job.target.spec}`, draft "
                          f"`{job.draft.path.name if job.draft else 'none'}`, tp {job.tp}, {job.dtype}.", {
                              "Serve": f"```sh\n{serve}\n```\n\nThe `{MODEL}` model is a Python-backend model "
                              f"(`{MODEL}/1/model.py`) around TensorRT-LLM's LLM API: it needs a Triton image with "
                              "TensorRT-LLM installed. `model.yaml` holds the LLM options, `speculative_config` "
                              "included. Inputs: `text_input`, optional `max_tokens`, `temperature`, `top_p`, `top_k`, "
                              "`streaming`, `seed`; responses carry `text_output` (a delta per response when "
                              "streaming), `finish_reason`, and on the last one `acceptance_rate`, "
                              "`total_accepted_draft_tokens` and `total_draft_tokens`.",
                              "TensorRT-LLM <= 1.2 engines": f"`{MODEL}/1/{ENSEMBLE_DIR}/` is the preprocessing / tensorrt_llm / "
                              "postprocessing / ensemble layout: build the engine with `--format tensorrt-llm`'s "
                              "build.sh, then fill `${engine_dir}` and `${tokenizer_dir}` in the config.pbtxt files "
                              "(TensorRT-LLM's `fill_template.py` does it) and add the backend's model.py files.",
                          })
    fields["launch"] = {"triton": serve}
    return fields


FORMAT = ExportFormat(name=ENGINE, engine="Triton Inference Server with TensorRT-LLM (LLM-API model; <=1.2 ensemble)",
                      write=write, check=check, needs_neural_draft=False, families=tuple(ARCHITECTURES))
