"""How the draft objective runs across `torchrun` ranks: alone, DDP (replicated), or FSDP (sharded).

FSDP is PyTorch's per-parameter FSDP (`fully_shard`, "FSDP2"): unlike the older FullyShardedDataParallel it runs
on CPU with gloo as well as on GPUs with NCCL, so the sharded path is tested here on 2 CPU processes. Under it the
parameters and the AdamW moments are sharded DTensors: the optimizer is built on the sharded parameters, and a
checkpoint gathers full tensors first, so the files look the same whichever way a run was distributed: a DDP
checkpoint can resume under FSDP and back.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn


class Parallel:
    def __init__(self, objective: nn.Module, world_size: int, fsdp: bool):
        self.fsdp = fsdp and world_size > 1
        if self.fsdp:
            from torch.distributed.fsdp import fully_shard

            # the objective is the root whose forward runs: it gathers all draft weights once per micro-batch
            fully_shard(objective)  # in place: the module becomes its FSDP version
            self.wrapped = objective
        elif world_size > 1:
            self.wrapped = nn.parallel.DistributedDataParallel(objective)
        else:
            self.wrapped = objective

    def __call__(self, *args):
        return self.wrapped(*args)

    def sync_gradients(self, sync: bool):
        """Context of one micro-batch: average gradients across ranks only on the last one of a step."""
        if sync:
            return contextlib.nullcontext()
        if self.fsdp:
            return _fsdp_no_sync(self.wrapped)
        if isinstance(self.wrapped, nn.parallel.DistributedDataParallel):
            return self.wrapped.no_sync()
        return contextlib.nullcontext()

    def full_state(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """`module.state_dict()` with whole tensors (FSDP shards gathered). Collective under FSDP."""
        return {name: _full(value) for name, value in module.state_dict().items()}

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        """The optimizer's state with whole tensors, keyed as a plain optimizer keys it. Collective under FSDP."""
        if not self.fsdp:
            return optimizer.state_dict()
        sharded = optimizer.state_dict()
        full = {"param_groups": sharded["param_groups"], "state": {}}
        for index, state in sharded["state"].items():
            full["state"][index] = {k: _full(v) for k, v in state.items()}
        return full

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """Load a state `optimizer_state` wrote (on any number of ranks, DDP or FSDP) into this rank's shard."""
        if not self.fsdp:
            optimizer.load_state_dict(state)
            return
        params = [p for group in optimizer.param_groups for p in group["params"]]
        sharded = {"param_groups": state["param_groups"], "state": {}}
        for index, entry in state["state"].items():
            param = params[int(index)]
            sharded["state"][index] = {k: _like(v, param) for k, v in entry.items()}
        optimizer.load_state_dict(sharded)


def _full(value):
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


def _like(value, param):
    """A whole tensor cut to `param`'s shard (moments have the parameter's shape; `step` is a scalar)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(param, DTensor) and isinstance(value, torch.Tensor) and value.shape == param.shape:
        return distribute_tensor(value.to(param.device), param.device_mesh, param.placements)
    return value


@contextlib.contextmanager
def _fsdp_no_sync(module):
    module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)
