"""--format triton-repo: every config.pbtxt parses into Triton's ModelConfig protobuf; the LLM-API model declares the
Triton contract the gateway speaks; model.yaml carries the LLM options with speculative_config; the repository root
holds only models Triton can load; the <= 1.2 ensemble loads with upstream's preprocessing / postprocessing
model.py files and carries end_id to the engine."""

from __future__ import annotations

import pytest
import yaml

from tests.export.conftest import run_export
from tests.kserve_triton import model_config_pb2
from tests.kserve_triton import parse_config as parse


@pytest.fixture(scope="module")
def repo(tmp_path_factory, targets, drafts):
    out = tmp_path_factory.mktemp("triton") / "repo"
    result = run_export(
        "--target",
        targets["llama"],
        "--draft",
        drafts["llama", "eagle3"],
        "--format",
        "triton-repo",
        "--tp",
        "2",
        "--num-speculative-tokens",
        "5",
        "--out",
        out,
    )
    assert result.returncode == 0, result.stderr
    return out


def test_every_config_pbtxt_parses_into_model_config(repo):
    configs = sorted(repo.rglob("config.pbtxt"))
    assert len(configs) == 5  # the LLM-API model + the four models of the <= 1.2 ensemble
    for path in configs:
        config = parse(path)
        assert config.name == path.parent.name


def test_llmapi_model_streams_and_reports_acceptance(repo):
    config = parse(repo / "tensorrt_llm" / "config.pbtxt")
    assert config.backend == "python" and config.model_transaction_policy.decoupled
    outputs = {o.name: o.data_type for o in config.output}
    assert outputs["acceptance_rate"] == model_config_pb2.TYPE_FP32
    assert {"total_accepted_draft_tokens", "total_draft_tokens", "text_output"} <= set(outputs)
    assert [i.name for i in config.input if not i.optional] == ["text_input"]


def _declared(config):
    return {i.name: (model_config_pb2.DataType.Name(i.data_type), list(i.dims)) for i in config.input}


def test_llmapi_model_takes_the_stock_llmapi_inputs_with_their_dims(repo):
    """NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt: unbatched, `text_input`
    TYPE_STRING [-1], `streaming` and every `sampling_param_*` one value ([1]), `sampling_param_stop` [-1]; the names
    upstream's 1/helpers.py get_sampling_params_from_request / get_streaming_from_request read."""
    config = parse(repo / "tensorrt_llm" / "config.pbtxt")
    assert config.max_batch_size == 0
    inputs = _declared(config)
    assert inputs["text_input"] == ("TYPE_STRING", [-1]) and inputs["streaming"] == ("TYPE_BOOL", [1])
    for name, dtype in [
        ("max_tokens", "TYPE_INT32"),
        ("temperature", "TYPE_FP32"),
        ("top_k", "TYPE_INT32"),
        ("top_p", "TYPE_FP32"),
        ("seed", "TYPE_UINT64"),
        ("return_perf_metrics", "TYPE_BOOL"),
    ]:
        assert inputs[f"sampling_param_{name}"] == (dtype, [1])
    assert inputs["sampling_param_stop"] == ("TYPE_STRING", [-1])
    assert {"stream", "max_tokens", "stop_words"}.isdisjoint(inputs)  # the ensemble's names are not this model's


def test_the_gateways_requests_fit_the_exported_config(repo):
    """The gateway builds its request from the config it reads back (service/gateway/signature.py): every input it
    sends is declared, with a shape Triton accepts for it."""
    from service.gateway.signature import ModelSignature, build_request
    from service.gateway.worker_client import GenerationRequest

    config = parse(repo / "tensorrt_llm" / "config.pbtxt")
    request = build_request(
        GenerationRequest(
            "r",
            "tensorrt_llm",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            seed=1,
            stop=["a", "b"],
            ignore_eos=True,
        ),
        False,
        ModelSignature.from_config(config),
    )
    inputs = _declared(config)
    for tensor in request.inputs:
        _, dims = inputs[tensor.name]
        assert len(tensor.shape) == len(dims) and all(d in (-1, s) for d, s in zip(dims, tensor.shape))
    assert {t.name: list(t.shape) for t in request.inputs}["sampling_param_stop"] == [2]


# What upstream's Python models index while they load and run (NVIDIA/TensorRT-LLM
# triton_backend/all_models/inflight_batcher_llm/): preprocessing/1/model.py TritonPythonModel.initialize reads
# model_config['parameters'][...]['string_value'] for these keys (a missing one is a KeyError), and the data_type of
# the inputs and outputs it lists in `input_names` / `output_names` (a missing one is None['data_type']);
# postprocessing/1/model.py initialize reads `tokenizer_dir` and the OUTPUT config, and its execute raises on any
# input other than TOKENS_BATCH and SEQUENCE_LENGTH.
_PRE_PARAMETERS = ("tokenizer_dir", "multimodal_model_path")
_PRE_CONFIG_INPUTS = ("EMBEDDING_BIAS_WORDS", "EMBEDDING_BIAS_WEIGHTS")
_PRE_CONFIG_OUTPUTS = (
    "INPUT_ID",
    "DECODER_INPUT_ID",
    "REQUEST_INPUT_LEN",
    "REQUEST_DECODER_INPUT_LEN",
    "BAD_WORDS_IDS",
    "STOP_WORDS_IDS",
    "OUT_END_ID",
    "OUT_PAD_ID",
    "OUT_PROMPT_TABLE_EXTRA_IDS",
    "PIXEL_VALUES",
    "IMAGE_SIZES",
)
#: preprocessing execute() builds these responses whatever the request
_PRE_SENT_OUTPUTS = (
    "INPUT_ID",
    "DECODER_INPUT_ID",
    "BAD_WORDS_IDS",
    "STOP_WORDS_IDS",
    "REQUEST_INPUT_LEN",
    "REQUEST_DECODER_INPUT_LEN",
    "REQUEST_OUTPUT_LEN",
    "EMBEDDING_BIAS",
    "OUT_END_ID",
    "OUT_PAD_ID",
)
_POST_INPUTS = {"TOKENS_BATCH", "SEQUENCE_LENGTH"}


def test_preprocessing_declares_what_upstreams_model_py_reads(repo):
    config = parse(repo / "tensorrt_llm" / "1" / "engine-repo" / "preprocessing" / "config.pbtxt")
    assert set(_PRE_PARAMETERS) <= set(config.parameters)
    assert set(_PRE_CONFIG_INPUTS) <= {i.name for i in config.input}
    assert set(_PRE_CONFIG_OUTPUTS) | set(_PRE_SENT_OUTPUTS) <= {o.name for o in config.output}
    assert {i.name for i in config.input if not i.optional} == {"QUERY", "REQUEST_OUTPUT_LEN"}


def test_postprocessing_gets_only_the_inputs_upstreams_execute_accepts(repo):
    root = repo / "tensorrt_llm" / "1" / "engine-repo"
    config = parse(root / "postprocessing" / "config.pbtxt")
    assert "tokenizer_dir" in config.parameters and "OUTPUT" in {o.name for o in config.output}
    (step,) = [
        s
        for s in parse(root / "ensemble" / "config.pbtxt").ensemble_scheduling.step
        if s.model_name == "postprocessing"
    ]
    assert set(step.input_map) == _POST_INPUTS


def test_ensemble_maps_end_id_through_preprocessing_into_the_engine(repo):
    """NVIDIA/TensorRT-LLM triton_backend/all_models/inflight_batcher_llm/ensemble/config.pbtxt: `end_id` goes to
    preprocessing's END_ID, whose OUT_END_ID (the tokenizer's end id when the request sets none) feeds the engine's
    `end_id`; the same for pad_id."""
    ensemble = parse(repo / "tensorrt_llm" / "1" / "engine-repo" / "ensemble" / "config.pbtxt")
    assert "end_id" in {i.name for i in ensemble.input}
    pre, engine, _ = ensemble.ensemble_scheduling.step
    assert pre.input_map["END_ID"] == "end_id"
    assert engine.input_map["end_id"] == pre.output_map["OUT_END_ID"]
    assert engine.input_map["pad_id"] == pre.output_map["OUT_PAD_ID"]
    assert engine.input_map["streaming"] == "stream"


def test_ensemble_declares_the_contract_and_reports_the_counts(repo):
    from deepspec_protocol import triton_contract as c

    ensemble = parse(repo / "tensorrt_llm" / "1" / "engine-repo" / "ensemble" / "config.pbtxt")
    assert ensemble.max_batch_size > 0
    assert {i.name for i in ensemble.input} == {s.name for s in c.ENSEMBLE_INPUTS}
    engine = ensemble.ensemble_scheduling.step[1]
    for name in (c.TOTAL_DRAFT_TOKENS, c.TOTAL_ACCEPTED_DRAFT_TOKENS, c.NUM_INPUT_TOKENS, c.NUM_OUTPUT_TOKENS):
        assert engine.output_map[name] == name and name in {o.name for o in ensemble.output}


def test_model_yaml_names_target_and_draft_inside_the_repository(repo):
    llm = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert llm["backend"] == "pytorch" and llm["tensor_parallel_size"] == 2
    assert llm["model"] == str(repo / "tensorrt_llm" / "1" / "target")
    assert (repo / "tensorrt_llm" / "1" / "target" / "config.json").is_file()
    spec = llm["speculative_config"]
    assert spec["decoding_type"] == "Eagle" and spec["max_draft_len"] == 5
    assert spec["eagle3_one_model"] is True and spec["allow_advanced_sampling"] is True
    from export.trtllm_releases import release

    assert release().refusal(spec) is None  # the pinned TensorRT-LLM's from_dict and strict fields take it
    assert spec["speculative_model_dir"] == str(repo / "tensorrt_llm" / "1" / "draft")
    assert (repo / "tensorrt_llm" / "1" / "draft" / "model.safetensors").is_file()
    assert llm["triton_config"] == {"max_batch_size": 0, "decoupled": True}


def test_repository_root_holds_only_loadable_models(repo):
    # Triton loads every directory at the root as a model; --exit-on-error stops on one without config.pbtxt
    models = [d for d in repo.iterdir() if d.is_dir()]
    assert [d.name for d in models] == ["tensorrt_llm"] and all((d / "config.pbtxt").is_file() for d in models)


def test_ensemble_wires_its_steps_to_models_that_exist(repo):
    root = repo / "tensorrt_llm" / "1" / "engine-repo"
    ensemble = parse(root / "ensemble" / "config.pbtxt")
    assert ensemble.platform == "ensemble"
    steps = [s.model_name for s in ensemble.ensemble_scheduling.step]
    assert steps == ["preprocessing", "tensorrt_llm", "postprocessing"]
    for step in ensemble.ensemble_scheduling.step:
        model = parse(root / step.model_name / "config.pbtxt")
        assert set(step.input_map) <= {i.name for i in model.input}
        assert set(step.output_map) <= {o.name for o in model.output}
    assert parse(root / "tensorrt_llm" / "config.pbtxt").backend == "tensorrtllm"


def test_the_ensemble_batches_no_more_than_the_engine_build_sh_builds(repo, tmp_path, targets):
    """NVIDIA/TensorRT-LLM triton_backend/all_models/inflight_batcher_llm: every model of the ensemble carries the
    engine's `max_batch_size` (upstream's fill_template sets `triton_max_batch_size` from the engine it serves); a
    larger one lets Triton form batches the engine (trtllm-build `--max_batch_size`) cannot hold. The bound is read
    from the build.sh that `--format tensorrt-llm` writes for the same target."""
    import re

    out = tmp_path / "trt"
    result = run_export("--target", targets["llama"], "--draft", "none", "--format", "tensorrt-llm", "--out", out)
    assert result.returncode == 0, result.stderr
    [engine_bound] = re.findall(r"--max_batch_size (\d+)", (out / "build.sh").read_text())
    for path in sorted((repo / "tensorrt_llm" / "1" / "engine-repo").rglob("config.pbtxt")):
        assert parse(path).max_batch_size == int(engine_bound), path.parent.name


def test_readme_and_help_say_the_ensemble_decodes_target_only(repo):
    """Nothing in the ensemble produces `draft_input_ids` (the engine's draft_tokens_external input, fed upstream by
    a BLS model around a separate draft engine), so it never speculates: the README and --help say so."""
    from tests.export.conftest import run_export_process

    ensemble = parse(repo / "tensorrt_llm" / "1" / "engine-repo" / "ensemble" / "config.pbtxt")
    fed = {v for step in ensemble.ensemble_scheduling.step for v in step.input_map}
    assert "draft_input_ids" not in fed
    readme = (repo / "README.md").read_text()
    assert "decodes target-only" in readme and "does not speculate" in readme
    assert "decodes target-only" in " ".join(run_export_process("--help").stdout.split())
