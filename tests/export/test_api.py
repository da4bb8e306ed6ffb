"""export as a library (export/api.py): typed arguments in, the bundle and its manifest out, `ExportError` for what
it cannot honour. The worker exports its ONNX bundle through it (service/worker/fastest_backend.py)."""

from __future__ import annotations

import json

import pytest

from export.api import ExportError, ExportRequest, export_bundle
from export.progress import quiet


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"tp": 0}, "--tp must be >= 1"),
        ({"num_speculative_tokens": 17}, "--num-speculative-tokens must be in 1..16"),
        ({"dtype": "int3"}, "--dtype must be one of bfloat16, float16, float32"),
        ({"quantization": "fp4"}, "--quantization must be one of auto, none, gguf, int8, int4"),
        ({"quantization": "int4"}, "--quantization int4 does not apply to --format pytorch: it takes none"),
    ],
)
def test_a_request_out_of_range_is_refused_before_anything_runs(tmp_path, fields, message):
    with pytest.raises(ExportError, match=message):
        ExportRequest(format="pytorch", out=tmp_path / "out", **fields)
    assert not (tmp_path / "out").exists()


def test_the_library_call_writes_what_the_cli_writes(tmp_path, targets):
    out = tmp_path / "bundle"
    result = export_bundle(
        # out as a str, as a library caller may give it: the request makes it a Path
        ExportRequest(
            format="pytorch",
            out=str(out),  # pyright: ignore[reportArgumentType]
            target=str(targets["llama"]),
            draft="prompt-lookup",
        ),
        quiet(),
    )
    assert result.out == out and result.manifest == json.loads((out / "manifest.json").read_text())
    assert result.manifest["format"] == "pytorch" and result.manifest["draft"] == "prompt-lookup"
    assert f"exported pytorch (no draft) to {out}" in result.summary("pytorch")


def test_bad_input_raises_and_leaves_nothing_behind(tmp_path, targets):
    with pytest.raises(ExportError, match="cannot take a gemma3_text target"):
        export_bundle(
            ExportRequest(format="triton-repo", out=tmp_path / "out", target=str(targets["gemma3_text"]), draft="none"),
            quiet(),
        )
    assert list(tmp_path.iterdir()) == []


def test_one_weight_format_option_refused_where_it_does_not_apply(tmp_path):
    """The worker's and export's --quantization take one set of values; each format honours its share."""
    with pytest.raises(
        ExportError, match="--quantization gguf does not apply to --format onnx: it takes auto, none, int8, int4"
    ):
        ExportRequest(format="onnx", out=tmp_path / "out", quantization="gguf")
    assert ExportRequest(format="onnx", out=tmp_path / "out", quantization="int8").quantization == "int8"
    assert ExportRequest(format="vllm", out=tmp_path / "out", quantization="none").quantization == "none"
