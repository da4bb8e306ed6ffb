"""`python -m export --format onnx` end to end: the CLI writes the engine directory, `python -m service worker
--bundle-dir DIR` serves it through ONNX Runtime, and a real `tritonclient` gRPC request gets the same greedy text
as from the PyTorch worker on the same fp32 weights."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from tests.service.conftest import REPO, Worker

PROMPTS = ["def fib(n):", "The capital of France is"]


def _complete(address: str, model: str, prompt: str, max_tokens: int) -> str:
    import tritonclient.grpc as triton

    client = triton.InferenceServerClient(address)
    text = triton.InferInput("text_input", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[prompt.encode()]], dtype=object))
    limit = triton.InferInput("max_tokens", [1, 1], "INT32")
    limit.set_data_from_numpy(np.array([[max_tokens]], dtype=np.int32))
    result = client.infer(model, [text, limit])
    client.close()
    assert result is not None
    text = result.as_numpy("text_output")
    assert text is not None
    return text[0][0].decode()


def _serve(tmp_path, *args: str) -> Worker:
    worker = Worker(
        tmp_path,
        *args,
        "--max-batch-size",
        "2",
        "--max-seq-len",
        "512",
        name="onnx" if "--bundle-dir" in args else "torch",
    )
    i = worker.args.index("--target")
    del worker.args[i : i + 2]
    return worker.start()


@pytest.mark.slow
@pytest.mark.integration
def test_worker_serves_the_onnx_export_with_the_pytorch_workers_text(tmp_path):
    out = tmp_path / "engine"
    export = subprocess.run(
        [sys.executable, "-m", "export", "--format", "onnx", "--draft", "prompt-lookup", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert export.returncode == 0, export.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "onnx" and manifest["draft"] == "prompt-lookup"
    assert "target.onnx" in manifest["files"] and "onnx.json" in manifest["files"]

    onnx_worker = _serve(tmp_path, "--bundle-dir", str(out))
    torch_worker = _serve(
        tmp_path, "--target", "smollm2-135m", "--draft", "none", "--dtype", "float32", "--quantization", "none"
    )
    try:
        onnx_worker.wait_ready(timeout_s=600)
        torch_worker.wait_ready(timeout_s=600)
        for prompt in PROMPTS:
            want = _complete(torch_worker.address, "smollm2-135m", prompt, 24)
            got = _complete(onnx_worker.address, "smollm2-135m", prompt, 24)
            assert got == want and got
    finally:
        onnx_worker.terminate()
        torch_worker.terminate()


def test_export_cli_refuses_an_unknown_onnx_quantization(tmp_path):
    from export.onnx.exporter import export_onnx

    with pytest.raises(ValueError, match="choose one of none, int4"):
        export_onnx("smollm2-135m", "none", tmp_path, "float32", "int3")
