"""Tensor parallelism on the Triton runtime: the chart starts one tritonserver per rank under mpirun, each in
TensorRT-LLM's LLM-API mode, as NVIDIA/TensorRT-LLM triton_backend/scripts/launch_triton_server.py get_cmd does with
--trtllm_llmapi_launch and --world_size N: `-n 1 trtllm-llmapi-launch tritonserver --model-repository=...` per rank,
ranks separated by `:`, ranks > 0 with `--model-control-mode=explicit --load-model=tensorrt_llm`, every rank with
`--disable-auto-complete-config` and its own `--backend-config=python,shm-region-prefix-name=prefix<rank>_`. The
model's side of it (rank 0 builds the LLM over MPI, the others wait) is tested in tests/export/test_triton_model.py."""

from __future__ import annotations

from tests.helm.conftest import VALUE_SETS, container, render, workload


def _ranks(args: list[str]) -> list[list[str]]:
    ranks, current = [], []
    for arg in args:
        if arg == ":":
            ranks.append(current)
            current = []
        else:
            current.append(arg)
    return ranks + [current]


def test_each_rank_runs_tritonserver_through_trtllm_llmapi_launch():
    worker = container(workload(render(VALUE_SETS["prod-triton-pvc"]), "worker")["spec"]["template"]["spec"], "worker")
    assert worker["command"] == ["mpirun"]
    ranks = _ranks(worker["args"])
    assert len(ranks) == 2  # tensorParallel 2
    for rank, args in enumerate(ranks):
        assert args[:4] == ["-n", "1", "trtllm-llmapi-launch", "tritonserver"]
        assert "--model-repository=$(DEEPSPEC_TRITON_MODEL_REPOSITORY)" in args
        assert "--disable-auto-complete-config" in args
        assert f"--backend-config=python,shm-region-prefix-name=prefix{rank}_" in args
        assert ("--load-model=tensorrt_llm" in args) == (rank > 0)


def test_one_rank_runs_tritonserver_alone():
    worker = container(workload(render(VALUE_SETS["triton-pvc"]), "worker")["spec"]["template"]["spec"], "worker")
    assert worker["command"] == ["tritonserver"] and "trtllm-llmapi-launch" not in worker["args"]
