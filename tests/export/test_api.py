"""export as a library (export/api.py): typed arguments in, the bundle and its manifest out, `ExportError` for what
it cannot honour. The worker exports its ONNX bundle through it (service/worker/fastest_engine.py)."""

from __future__ import annotations

import json

import pytest

from export.api import ExportError, ExportRequest, export_bundle
from export.progress import quiet


@pytest.mark.parametrize("fields, message", [
    ({"tp": 0}, "--tp must be >= 1"),
    ({"num_speculative_tokens": 17}, "--num-speculative-tokens must be in 1..16"),
    ({"dtype": "int3"}, "--dtype must be one of bfloat16, float16, float32"),
    ({"quantization": "fp4"}, "--quantization must be one of none, int4, int8, auto"),
    ({"quantization": "int4"}, "--quantization applies to --format onnx only"),
])
def test_a_request_out_of_range_is_refused_before_anything_runs(tmp_path, fields, message):
    with pytest.raises(ExportError, match=message):
        ExportRequest(format="pytorch", out=tmp_path / "out", **fields)
    assert not (tmp_path / "out").exists()


def test_the_library_call_writes_what_the_cli_writes(tmp_path, targets):
    out = tmp_path / "bundle"
    result = export_bundle(ExportRequest(format="pytorch", out=str(out), target=str(targets["llama"]),
                                         draft="prompt-lookup"), quiet())
    assert result.out == out and result.manifest == json.loads((out / "manifest.json").read_text())
    assert result.manifest["format"] == "pytorch" and result.manifest["draft"] == "prompt-lookup"
    assert f"exported pytorch (no draft) to {out}" in result.summary("pytorch")


def test_bad_input_raises_and_leaves_nothing_behind(tmp_path, targets):
    with pytest.raises(ExportError, match="cannot take a gemma3_text target"):
        export_bundle(ExportRequest(format="triton-repo", out=tmp_path / "out", target=str(targets["gemma3_text"]),
                                    draft="none"), quiet())
    assert list(tmp_path.iterdir()) == []
