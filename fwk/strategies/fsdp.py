"""Sharded data parallelism (FSDP2's ``fully_shard``) and its checkpoint state.

``parallel.py`` uses it for ``parallel=fsdp`` and ``parallel=hsdp``. Sharding happens in
place, after the other strategies (``parallelize.py``). The fp32 islands of the precision
strategy become units of their own with fp32 parameters, then every block
(``modules.blocks``), then the root. Activation checkpointing and the JIT layer wrap the same
modules and keep working: FSDP's hooks run around the module call, and the checkpointed or
compiled forward runs inside it.

Model and optimizer state are saved with ``torch.distributed.checkpoint``: every rank
writes its own shards, and a load reshards to whatever mesh the loading run has.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard

from fwk.strategies.modules import blocks

_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def mesh(device: torch.device, world: int, shard_size: int | None) -> DeviceMesh:
    """Build a 1-D mesh over all ranks for fsdp, or a 2-D (replicate, shard) one for hsdp."""
    if shard_size is None or shard_size == world:
        return init_device_mesh(device.type, (world,), mesh_dim_names=("shard",))
    return init_device_mesh(device.type, (world // shard_size, shard_size), mesh_dim_names=("replicate", "shard"))


def shard(
    model: nn.Module,
    device_mesh: DeviceMesh,
    param_dtype: torch.dtype | None,
    fp32_islands: list[nn.Module],
    reshard_after_forward: bool,
) -> list[str]:
    """Shard ``model`` in place and return the names of the units, inner first and root last.

    FSDP2 shards contiguous parameters only, and its all-gather gives contiguous ones back
    each step, so conv weights that the precision strategy made channels-last go back to
    the contiguous format here. The inputs stay channels-last (``Precision.prepare_input``), and
    that is what makes oneDNN and cuDNN pick their NHWC kernels: their convolutions return
    channels-last activations when the input is channels-last, whatever the weight's format
    (benchmarks/channels_last.py measures both against fully channels-last DDP).
    """
    model.to(memory_format=torch.contiguous_format)  # in place, as Module.to is; a no-op when already so
    mixed = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
    fp32 = MixedPrecisionPolicy()
    named = {id(m): n for n, m in model.named_modules()}
    units: list[str] = []
    block_list = [m for _, m in blocks(model)]
    if param_dtype is not None:
        # BatchNorms keep fp32 parameters, as FSDP1's MixedPrecision leaves them out by default:
        # their running statistics stay fp32, and the CPU kernel refuses bf16 weights beside
        # them ("expected scalar type BFloat16 but found Float"). Leaves first: inner units
        # are sharded before the modules that hold them.
        norms = [m for m in model.modules() if isinstance(m, _BATCH_NORMS) and m is not model]
        for module in {id(m): m for m in [*norms, *fp32_islands]}.values():  # an island may be a norm
            if module is not model and not any(module is b for b in block_list):
                fully_shard(module, mesh=device_mesh, mp_policy=fp32, reshard_after_forward=reshard_after_forward)
                units.append(named[id(module)])
    islands = {id(m) for m in fp32_islands}
    for block in block_list:
        if block is model:
            continue
        policy = fp32 if id(block) in islands else mixed
        fully_shard(block, mesh=device_mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
        units.append(named[id(block)])
    # the root keeps its parameters gathered after forward: backward needs them first
    fully_shard(model, mesh=device_mesh, mp_policy=fp32 if id(model) in islands else mixed, reshard_after_forward=False)
    units.append("<root>")
    return units


class Sharded(nn.Module):
    """The model the step calls: ``model`` (maybe the JIT's wrapper) around the sharded root.

    ``no_sync`` skips the gradient reduce-scatter on all but the last piece of an
    accumulated step, as DDP's ``no_sync`` skips the all-reduce.
    """

    def __init__(self, model: nn.Module, root: nn.Module) -> None:
        super().__init__()
        self.model = model
        self._root = [root]  # a list: not registered twice as a submodule

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        root = self._root[0]
        assert isinstance(root, FSDPModule)
        root.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            root.set_requires_gradient_sync(True)


def model_state(model: nn.Module, optimizer: torch.optim.Optimizer, flat: bool = True) -> dict[str, Any]:
    """Return the {"model", "optimizer"} state as DTensor shards, keyed by parameter names.
    With ``flat`` the optimizer's is one entry per parameter and value, so that ranks holding
    different parameters, the pipeline stages, write and read only their own."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(flatten_optimizer_state_dict=flat)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    return {"model": _strided_whole(model_sd), "optimizer": _strided_whole(optim_sd)}


def load_model_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    # torch.distributed.checkpoint's import is paid only by a sharded run, where it is needed
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    flat = any(isinstance(k, str) and k.startswith(("state.", "param_groups.")) for k in state["optimizer"])
    options = StateDictOptions(flatten_optimizer_state_dict=flat)
    if flat:  # the whole tensors _strided_whole wrote go back to this rank's slices
        model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
        _strided_again(state["model"], model_sd)
        _strided_again(state["optimizer"], optim_sd)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"], options=options
    )


def _strided(value: Any) -> bool:
    return isinstance(value, DTensor) and any(isinstance(p, _StridedShard) for p in value.placements)


def _strided_whole(state: dict[str, Any]) -> dict[str, Any]:
    """Return the state with its strided DTensors as whole tensors. A fused q/k/v projection split
    by chunks under tensor parallel is one (``fwk/models/gpt_parallel.py``). torch.distributed.checkpoint
    stores a shard as one contiguous block, which a strided slice is not. The matrices are
    small, and every rank holds the same whole copy, written once."""
    return {k: v.full_tensor() if _strided(v) else v for k, v in state.items()}


def _strided_again(state: dict[str, Any], current: dict[str, Any]) -> None:
    for key, now in current.items():
        if _strided(now) and key in state and not isinstance(state[key], DTensor):
            state[key] = distribute_tensor(state[key].to(now.device), now.device_mesh, now.placements)


def load_whole_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Shard the whole tensors of an unsharded checkpoint into this rank's part.

    Such a checkpoint holds ``Module.state_dict()`` and ``Optimizer.state_dict()``, as a run on one
    process writes them.

    The optimizer's state is keyed by parameter index, in the order it was built over the
    same model's parameters. The names let ``set_state_dict`` place it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    names = {id(p): name for name, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    whole = state["optimizer"]
    by_name = {
        "state": {order[i]: value for i, value in whole["state"].items()},
        "param_groups": [{**g, "params": [order[i] for i in g["params"]]} for g in whole["param_groups"]],
    }
    options = StateDictOptions(full_state_dict=True)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=by_name, options=options)
