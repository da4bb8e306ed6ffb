"""`load_target` on a `python -m export --format onnx` directory: the one loader opens it as an `OnnxTarget` (what
the worker serves), with the loader's chat-template options, and refuses what an export cannot do."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from deepspec.models import load_target
from deepspec.models.chat_templates import BUILTIN_CHAT_TEMPLATES, MissingChatTemplateError
from deepspec.models.onnx_target import OnnxTarget, load_onnx_target
from tests.export.conftest import HD16, write_hf_target


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(the PyTorch target, the ONNX export of it without a chat template)."""
    from export.onnx.exporter import export_onnx

    root = tmp_path_factory.mktemp("onnx")
    pytorch = load_target(str(write_hf_target(root / "llama", "llama", chat_template=None, **HD16)))
    out = root / "export"
    out.mkdir()
    export_onnx(pytorch, "none", out)
    return pytorch, out


def test_an_export_directory_loads_as_the_onnx_target_of_the_same_model(exported):
    pytorch, out = exported
    target = load_target(str(out), dtype="bfloat16", max_seq_len=64)  # the graph's own float32, whatever dtype says
    assert isinstance(target, OnnxTarget) and target.dtype == torch.float32 and target.max_seq_len == 64
    assert target.fingerprint() == pytorch.fingerprint()
    tokens = torch.tensor([[1, 40, 41, 42]])
    start = torch.zeros(1, dtype=torch.long)
    torch.testing.assert_close(
        target.forward(tokens, start).logits, pytorch.forward(tokens, start).logits, atol=1e-4, rtol=1e-4
    )


def test_the_chat_template_options_apply_to_an_export(exported):
    _, out = exported
    with pytest.raises(MissingChatTemplateError):
        load_target(str(out), for_chat=True)
    target = load_target(str(out), chat_template="gemma3", for_chat=True)
    assert target.tokenizer.chat_template == BUILTIN_CHAT_TEMPLATES["gemma3"]
    assert target.encode_chat([{"role": "user", "content": "Hi"}])


def test_gguf_matmuls_on_an_export_are_refused_with_the_way_out(exported):
    _, out = exported
    with pytest.raises(ValueError, match="ONNX export.*drop --quantization gguf"):
        load_target(str(out), quantization="gguf")


@pytest.mark.parametrize(
    ("value", "mode"),
    [(None, "run"), ("off", "off"), ("0", "off"), ("run", "run"), ("1", "always"), ("always", "always")],
)
def test_the_spinning_environment_variable_sets_the_session_s_thread_pool(monkeypatch, value, mode):
    from deepspec.models.onnx_target import session_options, spinning_mode

    if value is None:
        monkeypatch.delenv("DEEPSPEC_ORT_SPINNING", raising=False)
    else:
        monkeypatch.setenv("DEEPSPEC_ORT_SPINNING", value)
    assert spinning_mode() == mode
    options = session_options(2, spinning_mode())
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == ("0" if mode == "off" else "1")
    # "run" spins only inside a run: ONNX Runtime stops the pool's spinning when the run returns
    assert options.get_session_config_entry("session.force_spinning_stop") == ("1" if mode == "run" else "0")


def test_a_misspelt_spinning_mode_is_refused_naming_the_accepted_ones(monkeypatch, exported):
    from deepspec.models.onnx_target import session_options

    monkeypatch.setenv("DEEPSPEC_ORT_SPINNING", "fast")
    with pytest.raises(ValueError, match="off, run, always"):
        load_target(str(exported[1]))
    with pytest.raises(ValueError, match="spinning must be one of"):
        session_options(1, True)  # pyright: ignore[reportArgumentType]  # the bad input under test


def test_a_target_decodes_the_same_whatever_its_threads_do_between_kernels(monkeypatch, exported):
    _, out = exported
    tokens, start = torch.tensor([[1, 40, 41, 42]]), torch.zeros(1, dtype=torch.long)
    logits = {}
    for mode in ("off", "run", "always"):
        monkeypatch.setenv("DEEPSPEC_ORT_SPINNING", mode)
        logits[mode] = load_onnx_target(out, num_threads=2).forward(tokens, start).logits
    assert torch.equal(logits["off"], logits["run"]) and torch.equal(logits["off"], logits["always"])
