import torch

from plugins import process_logits as sampling_probs


def test_top_k_keeps_k_tokens_per_row():
    logits = torch.tensor([[[4.0, 3.0, 2.0, 1.0]], [[4.0, 3.0, 2.0, 1.0]]])
    p = sampling_probs(logits, torch.tensor([1.0, 1.0]), torch.tensor([2, 0]), torch.tensor([1.0, 1.0]))
    assert (p[0, 0] > 0).tolist() == [True, True, False, False]
    assert (p[1, 0] > 0).all()


def test_top_p_keeps_the_token_that_crosses_the_line():
    logits = torch.log(torch.tensor([[[0.5, 0.3, 0.15, 0.05]]]))
    p = sampling_probs(logits, torch.tensor([1.0]), torch.tensor([0]), torch.tensor([0.6]))
    torch.testing.assert_close(p[0, 0], torch.tensor([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0]))


def test_temperature_sharpens():
    logits = torch.tensor([[[2.0, 1.0]]])
    cold = sampling_probs(logits, torch.tensor([0.5]), torch.tensor([0]), torch.tensor([1.0]))
    hot = sampling_probs(logits, torch.tensor([2.0]), torch.tensor([0]), torch.tensor([1.0]))
    assert cold[0, 0, 0] > hot[0, 0, 0]
