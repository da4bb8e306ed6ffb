"""The fake CUDA device of fake_cuda.py refuses what CUDA refuses and allows what CUDA allows, with real values.

Each refusal is one of CUDA's own rules: mixed devices in one op (TensorIterator's check; a 0-dim CPU tensor is a
scalar and may join, as torch/_subclasses/fake_tensor.py `FakeTensor._find_common_device` models it), the index
rules of pytorch/pytorch aten/src/ATen/native/TensorAdvancedIndexing.cpp (`check_indices_on_cpu_or_selfdevice`: CPU
indices may index a CUDA tensor, not the reverse; `_index_put_impl_`: values on the tensor's device unless a single
0-dim element), and `at::check_generator` (aten/src/ATen/core/Generator.h: a generator draws only for its own
device type).
Without these negative controls a device test that passes proves nothing.
"""

from __future__ import annotations

import pytest
import torch

from tests.deepspec.decoding.fake_cuda import CUDA, FakeCudaGenerator, FakeCudaTensor, fake_cuda

MIXED = "Expected all tensors to be on the same device"
INDEX = "indices should be either on cpu or on the same device"


def test_cuda_tensors_hold_real_values():
    with fake_cuda():
        x = torch.arange(6, device="cuda").view(2, 3)
        y = torch.tensor([1.0, 2.0, 3.0]).to("cuda")
        assert isinstance(x, FakeCudaTensor) and x.device == CUDA and (x + 1).device == CUDA
        assert x.tolist() == [[0, 1, 2], [3, 4, 5]] and int(x.argmax()) == 5 and float(y.sum()) == 6.0
        x[0, 0] = 7  # writes land in the values a view and later reads see
        row = x[0]
        row[1] = 8
        assert x[0].tolist() == [7, 8, 2]
        back = x.cpu()
        back[0, 0] = 0  # a copy: the cuda tensor keeps its value
        assert back.device.type == "cpu" and int(x[0, 0]) == 7
        layer = torch.nn.Linear(3, 2).to("cuda")
        assert layer.weight.device == CUDA and layer(y).device == CUDA


def test_mixing_a_cpu_tensor_into_a_cuda_op_is_refused():
    with fake_cuda():
        x = torch.ones(3, device="cuda")
        for op in (
            lambda: x + torch.ones(3),
            lambda: x / torch.ones(3, 1, 1),
            lambda: torch.cat([x, torch.ones(3)]),
            lambda: torch.ones(3) * torch.tensor(2.0, device="cuda"),  # a cuda scalar is no cpu scalar
            lambda: torch.zeros(2, 4, device="cuda").scatter_(
                -1, torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1, device="cuda")
            ),
            lambda: torch.nn.functional.embedding(torch.tensor([0]), torch.ones(4, 3, device="cuda")),
        ):
            with pytest.raises(RuntimeError, match=MIXED):
                op()
        with pytest.raises(TypeError, match="can't convert cuda:0 device type tensor to numpy"):
            x.numpy()


def test_what_cuda_allows_across_devices():
    with fake_cuda():
        x = torch.zeros(2, 3, device="cuda")
        assert (x * torch.tensor(2.0)).device == CUDA  # a 0-dim cpu tensor is a scalar
        assert x[torch.tensor([1, 0])].device == CUDA  # cpu indices
        x[torch.tensor([True, False])] = torch.tensor(1.0)
        x[1] = torch.full((3,), 2.0)  # a slice assignment is a copy, and copies cross devices
        assert x.tolist() == [[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]
        with pytest.raises(RuntimeError, match=INDEX):
            torch.ones(3)[torch.tensor([0], device="cuda")]  # cuda indices into a cpu tensor
        with pytest.raises(RuntimeError, match=MIXED):
            x[torch.tensor([True, False])] = torch.ones(1, 3)  # index_put_'s values: on the tensor's device


def test_a_generator_draws_only_for_its_own_device():
    with fake_cuda():
        probs = torch.softmax(torch.ones(2, 4, device="cuda"), dim=-1)
        host = torch.Generator().manual_seed(0)
        device = torch.Generator(device="cuda").manual_seed(0)
        assert isinstance(device, FakeCudaGenerator) and device.device == CUDA and isinstance(host, torch.Generator)
        assert torch.multinomial(probs, 1, generator=device).device == CUDA
        assert torch.randint(10, (1,), generator=host).device.type == "cpu"
        for draw in (
            lambda: torch.multinomial(probs, 1, generator=host),
            lambda: torch.rand(2, generator=host, device="cuda"),
            lambda: torch.empty(3, device="cuda").exponential_(generator=host),
            lambda: torch.randint(10, (1,), generator=device),
        ):
            with pytest.raises(RuntimeError, match="device type for generator"):
                draw()
    assert torch.Generator is torch._C.Generator  # restored on exit


def test_verification_ops_run_their_reference_on_cuda_and_refuse_mixed_inputs():
    import plugins

    with fake_cuda():
        logits = torch.zeros(1, 3, 5, device="cuda")
        logits[0, :, 2] = 1.0  # the target's argmax is 2 everywhere: draft 2 is accepted, draft 4 is not
        drafts = torch.tensor([[2, 4]], device="cuda")
        num_accepted, next_token = plugins.greedy_accept(drafts, torch.tensor([2], device="cuda"), logits)
        assert num_accepted.device == CUDA and num_accepted.tolist() == [1] and next_token.tolist() == [2]
        with pytest.raises(RuntimeError, match=MIXED):
            plugins.greedy_accept(drafts, torch.tensor([2]), logits)  # a CPU count vector meets cuda logits
