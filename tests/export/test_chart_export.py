"""The chart's export init container, really run: render helm/deepspec, take the init container's command and
arguments, expand them as Kubernetes would, run them here against the default target, then start the worker on
the bundle they wrote. Also: the triton runtime serves exactly the repository the export writes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from export.manifest import verify_files
from tests.helm.conftest import VALUE_SETS, container, one, render, workload

REPO = Path(__file__).resolve().parents[2]
CPU_EXPORT = {"worker": {"device": "cpu", "bundles": {"source": "export"}}}


def _pod(values):
    docs = render(values)
    spec = workload(docs, "worker")["spec"]["template"]["spec"]
    config = one(docs, "ConfigMap", "model")["data"]
    return spec, config


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in command and args (unknown references stay as written)."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), text)


def test_default_cpu_export_is_the_format_the_worker_serves():
    _, config = _pod(CPU_EXPORT)
    assert config["DEEPSPEC_EXPORT_FORMAT"] == "pytorch"


def test_triton_runtime_serves_the_repository_the_export_writes():
    spec, config = _pod(VALUE_SETS["triton"])
    assert config["DEEPSPEC_EXPORT_FORMAT"] == "triton-repo"
    script = _expand(container(spec, "export-bundle")["args"][0], config)
    assert f'out="{config["DEEPSPEC_TRITON_MODEL_REPOSITORY"]}"' in script and '--out "$out"' in script
    server = container(spec, "worker")
    assert server["command"] == ["tritonserver"]
    repo_flag = _expand(next(a for a in server["args"] if a.startswith("--model-repository=")), config)
    assert repo_flag == f"--model-repository={config['DEEPSPEC_TRITON_MODEL_REPOSITORY']}"


@pytest.mark.slow
@pytest.mark.integration
def test_init_container_command_runs_here_and_the_worker_serves_its_output(tmp_path):
    import tritonclient.grpc as triton

    from tests.service.conftest import Worker

    spec, config = _pod(CPU_EXPORT)
    init = container(spec, "export-bundle")
    bundle_dir = tmp_path / "bundles" / "bundle"
    env = {**config, "DEEPSPEC_BUNDLE_DIR": str(bundle_dir)}
    argv = [_expand(a, env) for a in init["command"] + init["args"]]
    run_env = {
        **os.environ,
        **env,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "OMP_NUM_THREADS": "1",
    }
    result = subprocess.run(argv, cwd=REPO, env=run_env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (bundle_dir / "manifest.json").is_file() and verify_files(bundle_dir) == []
    again = subprocess.run(argv, cwd=REPO, env=run_env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "already exported" in again.stdout  # a restarted pod skips the export

    worker = Worker(tmp_path, "--bundle-dir", str(bundle_dir), "--max-batch-size", "1")
    i = worker.args.index("--target")
    del worker.args[i : i + 2]  # target and draft come from the manifest
    worker.start().wait_ready(timeout_s=300)
    try:
        client = triton.InferenceServerClient(worker.address)
        text = triton.InferInput("text_input", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"def fib(n):"]], dtype=object))
        max_tokens = triton.InferInput("max_tokens", [1, 1], "INT32")
        max_tokens.set_data_from_numpy(np.array([[8]], dtype=np.int32))
        result = client.infer(config["DEEPSPEC_TARGET"], [text, max_tokens])
        assert result is not None
        num_output_tokens = result.as_numpy("num_output_tokens")
        assert num_output_tokens is not None and num_output_tokens[0][0] > 0
        client.close()
    finally:
        worker.terminate()
