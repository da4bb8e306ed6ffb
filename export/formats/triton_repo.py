"""`--format triton-repo`: a Triton Inference Server model repository around TensorRT-LLM.

Two layouts, one directory:

- the repository root is TensorRT-LLM's LLM-API model (what `tritonserver --model-repository=OUT` serves, and what
  the chart's `worker.runtime: triton` points at): `tensorrt_llm/config.pbtxt` (Python backend, decoupled streaming,
  the inputs and outputs of `deepspec_protocol/triton_contract.py`: upstream's LLM-API names plus our optional
  additions) and `tensorrt_llm/1/model.yaml` (LLM kwargs: the target copied into `tensorrt_llm/1/target/`, backend
  pytorch, tensor_parallel_size, `speculative_config` naming the EAGLE-3 draft in `tensorrt_llm/1/draft/`,
  triton_config). Its `model.py` is ours (export/triton/llmapi_model.py, with the contract copied beside it):
  Triton's Python backend around `tensorrt_llm.LLM`, streaming text and reporting each request's counts.
- `tensorrt_llm/1/engine-repo/` is the <= 1.2 ensemble repository (`preprocessing`, `tensorrt_llm` on the
  `tensorrtllm` backend, `postprocessing`, `ensemble`) for an engine built by `--format tensorrt-llm`'s build.sh;
  serve it with `tritonserver --model-repository=OUT/tensorrt_llm/1/engine-repo`. It decodes target-only: the
  engine's EAGLE mode is EAGLE-1/2 and its `draft_tokens_external` mode verifies draft tokens that a separate draft
  engine must feed through `draft_input_ids` (upstream's BLS `tensorrt_llm_bls` with a draft model), which this
  export does not build. Its `max_batch_size` is the engine's (`ENGINE_MAX_BATCH_SIZE`, what build.sh passes to
  trtllm-build): a larger one would let Triton batch more requests than the engine holds.

Every config.pbtxt parses into Triton's ModelConfig protobuf (tests do it with tritonclient's copy).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from deepspec.models.chat_templates import save_chat_template
from deepspec_protocol import triton_contract as contract
from export import snippets
from export.drafts.writers import check_draft, write_draft
from export.formats.tensorrt_llm import ENGINE_MAX_BATCH_SIZE
from export.job import ExportFormat, ExportJob
from export.triton import CONTRACT_PY, LLMAPI_MODEL_PY
from export.trtllm_checkpoint import ARCHITECTURES, check_sizes

ENGINE = "triton-repo"
MODEL = "tensorrt_llm"
#: what the README and --help say about the <= 1.2 ensemble's decoding
ENSEMBLE_DECODES = "decodes target-only (no draft feeds the engine's draft_input_ids)"
#: the <= 1.2 ensemble repository, inside the version directory: Triton treats every directory at the repository
#: root as a model (and --exit-on-error stops on one without config.pbtxt), and ignores what a version holds
ENSEMBLE_DIR = "engine-repo"
_TARGET_FILES = ("*.json", "*.safetensors", "*.model", "*.txt", "*.jinja")


def check(job: ExportJob) -> None:
    check_sizes(job.target.arch, job.tp)
    check_draft("tensorrt-llm", job)  # the TensorRT-LLM model runs what TensorRT-LLM loads


def _tensor(name: str, dtype: str, dims: str = "[ 1 ]", optional: bool = False) -> str:
    return (
        f'  {{\n    name: "{name}"\n    data_type: {dtype}\n    dims: {dims}'
        + ("\n    optional: true" if optional else "")
        + "\n  }"
    )


def _spec(spec: contract.TensorSpec, is_input: bool = True) -> str:
    """One contract tensor as config.pbtxt writes it (outputs carry no `optional`)."""
    dims = "[ " + ", ".join(str(d) for d in spec.dims) + " ]"
    return _tensor(spec.name, contract.CONFIG_DATATYPE[spec.datatype], dims, optional=is_input and spec.optional)


def _io(kind: str, tensors: list[str]) -> str:
    return f"{kind} [\n" + ",\n".join(tensors) + "\n]\n"


def _parameters(values: dict[str, str]) -> str:
    return "".join(f'parameters {{\n  key: "{k}"\n  value: {{ string_value: "{v}" }}\n}}\n' for k, v in values.items())


def llmapi_config_pbtxt(job: ExportJob) -> str:
    """The LLM-API model: the contract's inputs and outputs, unbatched (`max_batch_size: 0`: a request is one
    prompt), decoupled (one request, a stream of responses)."""
    return (
        f'name: "{MODEL}"\nbackend: "python"\nmax_batch_size: 0\n'
        "model_transaction_policy {\n  decoupled: true\n}\n"
        + _io("input", [_spec(s) for s in contract.LLMAPI_INPUTS])
        + _io("output", [_spec(s, is_input=False) for s in contract.LLMAPI_OUTPUTS])
        + _parameters({contract.TEXT_OUTPUT_MODE: contract.TEXT_DELTA})
        + "instance_group [\n  {\n    count: 1\n    kind: KIND_MODEL\n  }\n]\n"
    )


#: the preprocessing model's tensors that upstream's model.py reads in initialize() (their data_type) or execute()
_PRE_INPUTS = [
    ("QUERY", "TYPE_STRING", "[ 1 ]", False),
    ("DECODER_QUERY", "TYPE_STRING", "[ 1 ]", True),
    ("REQUEST_OUTPUT_LEN", "TYPE_INT32", "[ 1 ]", False),
    ("BAD_WORDS_DICT", "TYPE_STRING", "[ -1 ]", True),
    ("STOP_WORDS_DICT", "TYPE_STRING", "[ -1 ]", True),
    ("EMBEDDING_BIAS_WORDS", "TYPE_STRING", "[ -1 ]", True),
    ("EMBEDDING_BIAS_WEIGHTS", "TYPE_FP32", "[ -1 ]", True),
    ("END_ID", "TYPE_INT32", "[ 1 ]", True),
    ("PAD_ID", "TYPE_INT32", "[ 1 ]", True),
    ("PROMPT_TABLE_EXTRA_ID", "TYPE_UINT64", "[ 1 ]", True),
]
_PRE_OUTPUTS = [
    ("INPUT_ID", "TYPE_INT32", "[ -1 ]"),
    ("REQUEST_INPUT_LEN", "TYPE_INT32", "[ 1 ]"),
    ("DECODER_INPUT_ID", "TYPE_INT32", "[ -1 ]"),
    ("REQUEST_DECODER_INPUT_LEN", "TYPE_INT32", "[ 1 ]"),
    ("BAD_WORDS_IDS", "TYPE_INT32", "[ 2, -1 ]"),
    ("STOP_WORDS_IDS", "TYPE_INT32", "[ 2, -1 ]"),
    ("EMBEDDING_BIAS", "TYPE_FP32", "[ -1 ]"),
    ("REQUEST_OUTPUT_LEN", "TYPE_INT32", "[ -1 ]"),
    ("OUT_END_ID", "TYPE_INT32", "[ 1 ]"),
    ("OUT_PAD_ID", "TYPE_INT32", "[ 1 ]"),
    ("OUT_PROMPT_TABLE_EXTRA_IDS", "TYPE_UINT64", "[ -1 ]"),
    ("PIXEL_VALUES", "TYPE_FP16", "[ -1, -1, -1, -1 ]"),
    ("IMAGE_SIZES", "TYPE_INT64", "[ -1, 2 ]"),
]
#: the engine model's inputs the ensemble feeds (upstream's names and dims), then its outputs
_ENGINE_INPUTS = [
    ("input_ids", "TYPE_INT32", "[ -1 ]", False),
    ("input_lengths", "TYPE_INT32", "[ 1 ]", False),
    ("request_output_len", "TYPE_INT32", "[ 1 ]", False),
    ("end_id", "TYPE_INT32", "[ 1 ]", True),
    ("pad_id", "TYPE_INT32", "[ 1 ]", True),
    ("stop_words_list", "TYPE_INT32", "[ 2, -1 ]", True),
    ("bad_words_list", "TYPE_INT32", "[ 2, -1 ]", True),
    ("embedding_bias", "TYPE_FP32", "[ -1 ]", True),
    ("temperature", "TYPE_FP32", "[ 1 ]", True),
    ("runtime_top_k", "TYPE_INT32", "[ 1 ]", True),
    ("runtime_top_p", "TYPE_FP32", "[ 1 ]", True),
    ("seed", "TYPE_UINT64", "[ 1 ]", True),
    ("streaming", "TYPE_BOOL", "[ 1 ]", True),
    ("return_perf_metrics", "TYPE_BOOL", "[ 1 ]", True),
    ("return_num_input_tokens", "TYPE_BOOL", "[ 1 ]", True),
    ("return_num_output_tokens", "TYPE_BOOL", "[ 1 ]", True),
    ("draft_input_ids", "TYPE_INT32", "[ -1 ]", True),
]
_ENGINE_OUTPUTS = [
    ("output_ids", "TYPE_INT32", "[ -1, -1 ]"),
    ("sequence_length", "TYPE_INT32", "[ -1 ]"),
    *(
        (s.name, contract.CONFIG_DATATYPE[s.datatype], "[ 1 ]")
        for s in contract.ENSEMBLE_OUTPUTS
        if s.name != contract.TEXT_OUTPUT
    ),
]


def ensemble_configs(job: ExportJob) -> dict[str, str]:
    """The <= 1.2 ensemble: model name -> config.pbtxt. Preprocessing and postprocessing are upstream's Python
    models: their config declares every parameter, input and output those model.py files read, and the ensemble
    maps `end_id` through preprocessing (which falls back to the tokenizer's) into the engine."""
    return {
        "preprocessing": _preprocessing_config(),
        "tensorrt_llm": _engine_config(job),
        "postprocessing": _postprocessing_config(),
        "ensemble": _ensemble_config(),
    }


#: the placeholder of the tokenizer directory, filled in by TensorRT-LLM's fill_template.py (README of the format)
_TOKENIZER_DIR = "${tokenizer_dir}"


def _preprocessing_config() -> str:
    """Upstream's preprocessing model: text and stop words → token ids, and the end id the engine stops at."""
    return (
        f'name: "preprocessing"\nbackend: "python"\nmax_batch_size: {ENGINE_MAX_BATCH_SIZE}\n'
        + _io("input", [_tensor(*t) for t in _PRE_INPUTS])
        + _io("output", [_tensor(*t) for t in _PRE_OUTPUTS])
        + _parameters(
            {
                "tokenizer_dir": _TOKENIZER_DIR,
                "add_special_tokens": "true",
                "multimodal_model_path": "",
                "gpt_model_path": "${engine_dir}",
                "max_num_images": "",
                "hf_model_path": "",
            }
        )
    )


def _engine_config(job: ExportJob) -> str:
    """The TensorRT-LLM backend model: decoupled (it streams), drafting up to the job's speculative tokens."""
    return (
        f'name: "tensorrt_llm"\nbackend: "tensorrtllm"\nmax_batch_size: {ENGINE_MAX_BATCH_SIZE}\n'
        "model_transaction_policy {\n  decoupled: true\n}\n"
        + _io("input", [_tensor(*t) for t in _ENGINE_INPUTS])
        + _io("output", [_tensor(*t) for t in _ENGINE_OUTPUTS])
        + _parameters(
            {
                "gpt_model_path": "${engine_dir}",
                "gpt_model_type": "inflight_fused_batching",
                "max_beam_width": "1",
                "max_draft_len": str(job.num_speculative_tokens),
            }
        )
    )


def _postprocessing_config() -> str:
    """Upstream's postprocessing model: output ids → text."""
    return (
        f'name: "postprocessing"\nbackend: "python"\nmax_batch_size: {ENGINE_MAX_BATCH_SIZE}\n'
        + _io(
            "input",
            [_tensor("TOKENS_BATCH", "TYPE_INT32", "[ -1, -1 ]"), _tensor("SEQUENCE_LENGTH", "TYPE_INT32", "[ -1 ]")],
        )
        + _io("output", [_tensor("OUTPUT", "TYPE_STRING", "[ -1 ]")])
        + _parameters({"tokenizer_dir": _TOKENIZER_DIR, "skip_special_tokens": "true"})
    )


def _ensemble_config() -> str:
    """The ensemble the gateway calls: the contract's tensors through preprocessing, the engine and
    postprocessing."""
    return (
        f'name: "ensemble"\nplatform: "ensemble"\nmax_batch_size: {ENGINE_MAX_BATCH_SIZE}\n'
        + _io("input", [_spec(s) for s in contract.ENSEMBLE_INPUTS])
        + _io("output", [_spec(s, is_input=False) for s in contract.ENSEMBLE_OUTPUTS])
        + "ensemble_scheduling {\n"
        + _step(
            "preprocessing",
            {
                "QUERY": "text_input",
                "REQUEST_OUTPUT_LEN": "max_tokens",
                "STOP_WORDS_DICT": "stop_words",
                "END_ID": "end_id",
            },
            {
                "INPUT_ID": "_INPUT_ID",
                "REQUEST_INPUT_LEN": "_REQUEST_INPUT_LEN",
                "REQUEST_OUTPUT_LEN": "_REQUEST_OUTPUT_LEN",
                "STOP_WORDS_IDS": "_STOP_WORDS_IDS",
                "OUT_END_ID": "_PREPROCESSOR_END_ID",
                "OUT_PAD_ID": "_PREPROCESSOR_PAD_ID",
            },
        )
        + ",\n"
        + _step(
            "tensorrt_llm",
            {
                "input_ids": "_INPUT_ID",
                "input_lengths": "_REQUEST_INPUT_LEN",
                "request_output_len": "_REQUEST_OUTPUT_LEN",
                "end_id": "_PREPROCESSOR_END_ID",
                "pad_id": "_PREPROCESSOR_PAD_ID",
                "stop_words_list": "_STOP_WORDS_IDS",
                "temperature": "temperature",
                "runtime_top_k": "top_k",
                "runtime_top_p": "top_p",
                "seed": "seed",
                "streaming": "stream",
                "return_perf_metrics": "return_perf_metrics",
                "return_num_input_tokens": "return_num_input_tokens",
                "return_num_output_tokens": "return_num_output_tokens",
            },
            {
                "output_ids": "_TOKENS_BATCH",
                "sequence_length": "_SEQUENCE_LENGTH",
                **{s.name: s.name for s in contract.ENSEMBLE_OUTPUTS if s.name != contract.TEXT_OUTPUT},
            },
        )
        + ",\n"
        + _step(
            "postprocessing",
            {"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH"},
            {"OUTPUT": contract.TEXT_OUTPUT},
        )
        + "\n}\n"
    )


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    def maps(kind, m):
        return "".join(f'    {kind} {{\n      key: "{k}"\n      value: "{v}"\n    }}\n' for k, v in m.items())

    return (
        f'  step {{\n    model_name: "{model}"\n    model_version: -1\n'
        + maps("input_map", inputs)
        + maps("output_map", outputs)
        + "  }"
    )


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
    if job.options.get("chat_template") is not None:  # the LLM API renders chat with the copied tokenizer
        template = save_chat_template(version / "target", job.options["chat_template"])
        fields["chat_template"] = str(template.relative_to(out))
    final = job.options.get("final_out") or out
    draft_dir = None
    if job.draft is not None:
        fields.update(write_draft("tensorrt-llm", job, version / "draft"))
        draft_dir = str(Path(final).resolve() / MODEL / "1" / "draft")
        fields["draft"] = f"{MODEL}/1/draft"
    llm = {
        "model": str(Path(final).resolve() / MODEL / "1" / "target"),
        **snippets.trtllm_llm_args(job, draft_dir, ""),
        "triton_config": {"max_batch_size": 0, "decoupled": True},
    }
    (version / "model.yaml").write_text(yaml.safe_dump(llm, sort_keys=False))
    shutil.copy2(LLMAPI_MODEL_PY, version / "model.py")
    shutil.copy2(CONTRACT_PY, version / CONTRACT_PY.name)
    for name, text in ensemble_configs(job).items():
        (version / ENSEMBLE_DIR / name / "1").mkdir(parents=True)
        (version / ENSEMBLE_DIR / name / "config.pbtxt").write_text(text)
    serve = "tritonserver --model-repository=OUT"
    snippets.write_readme(
        out,
        "Triton model repository (TensorRT-LLM)",
        f"Target `{job.target.spec}`, draft "
        f"`{job.draft.path.name if job.draft else 'none'}`, tp {job.tp}, {job.dtype}.",
        {
            "Serve": f"```sh\n{serve}\n```\n\nThe `{MODEL}` model is a Python-backend model "
            f"(`{MODEL}/1/model.py`) around TensorRT-LLM's LLM API: it needs a Triton image with "
            "TensorRT-LLM installed. `model.yaml` holds the LLM options, `speculative_config` "
            "included. Inputs are the stock LLM-API model's: `text_input`, optional `streaming` and "
            "`sampling_param_{max_tokens,temperature,top_p,top_k,seed,stop}`, plus `messages_json` "
            "(chat, rendered with the target's template) and `ignore_eos`; responses carry "
            "`text_output` (a delta per response when streaming), `finish_reason`, "
            "`num_input_tokens`, `num_output_tokens`, `acceptance_rate`, "
            "`total_accepted_draft_tokens` and `total_draft_tokens`. Decoupled: use the streaming "
            "gRPC (`ModelStreamInfer`) or `/generate_stream`, also without streaming.",
            "TensorRT-LLM <= 1.2 engines": f"`{MODEL}/1/{ENSEMBLE_DIR}/` is the preprocessing / "
            "tensorrt_llm / postprocessing / ensemble layout: build the engine with `--format "
            "tensorrt-llm`'s build.sh, then fill `${engine_dir}` and `${tokenizer_dir}` in the "
            "config.pbtxt files (TensorRT-LLM's `fill_template.py` does it) and add the backend's "
            f"model.py files. **It {ENSEMBLE_DECODES}: it does not speculate.** The draft runs only "
            f"in the `{MODEL}` LLM-API model above. Its max_batch_size is the engine's "
            f"({ENGINE_MAX_BATCH_SIZE}, build.sh's `--max_batch_size`).",
        },
    )
    fields["launch"] = {"triton": serve}
    return fields


FORMAT = ExportFormat(
    name=ENGINE,
    runtime=f"Triton Inference Server with TensorRT-LLM (LLM-API model; the <=1.2 engine ensemble {ENSEMBLE_DECODES})",
    write=write,
    check=check,
    needs_neural_draft=False,
    families=tuple(ARCHITECTURES),
)
