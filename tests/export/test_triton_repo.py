"""--format triton-repo: every config.pbtxt parses into Triton's ModelConfig protobuf; model.yaml carries the LLM
options with speculative_config; the repository root holds only models Triton can load."""

from __future__ import annotations

import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tests.export.conftest import run_export


@pytest.fixture(scope="module")
def repo(tmp_path_factory, targets, drafts):
    out = tmp_path_factory.mktemp("triton") / "repo"
    result = run_export("--target", targets["llama"], "--draft", drafts["llama", "eagle3"], "--format", "triton-repo",
                        "--tp", "2", "--num-speculative-tokens", "5", "--out", out)
    assert result.returncode == 0, result.stderr
    return out


def parse(path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


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


def test_model_yaml_names_target_and_draft_inside_the_repository(repo):
    llm = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert llm["backend"] == "pytorch" and llm["tensor_parallel_size"] == 2
    assert llm["model"] == str(repo / "tensorrt_llm" / "1" / "target")
    assert (repo / "tensorrt_llm" / "1" / "target" / "config.json").is_file()
    spec = llm["speculative_config"]
    assert spec["decoding_type"] == "Eagle3" and spec["max_draft_len"] == 5
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
