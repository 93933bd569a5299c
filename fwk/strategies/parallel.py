"""Data parallelism along the mesh's data dimension: config group ``parallel``.

``parallelize.py`` calls ``wrap`` after tensor and pipeline parallelism. The process group
and the mesh are ``fwk.distributed``'s. One process trains alone. ``dp_replicate`` alone
replicates the model with DDP (``ddp.py`` times and adapts its communication), ``dp_shard``
shards it with FSDP2 (``fsdp.py``), and HSDP uses both. ``auto`` decides the data dimension
from measured facts and says them in one line. When parameters + gradients + optimizer state
are within ``auto_memory_share`` of the free memory of one device, it replicates. Otherwise
it shards, inside each node when there are several.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import replace

import torch
import torch.distributed as tdist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from fwk.config.schema import ParallelConfig
from fwk.distributed import mesh
from fwk.distributed.dims import Dims
from fwk.distributed.group import Dist
from fwk.strategies.precision import Precision

logger = logging.getLogger(__name__)


def _free_device_bytes(device: torch.device) -> int:
    """Return the free memory of one device: the GPU's, or this process's share of the host's."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with open("/proc/meminfo") as f:
        available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    return available // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def training_bytes(model: nn.Module, optimizer_floats: float) -> int:
    """Return the bytes of an unsharded model's parameters, gradients and optimizer state.

    ``optimizer_floats`` is the optimizer state's elements per parameter element: AdamW 2, Lion 1.
    """
    params = list(model.parameters())
    return int(sum(p.numel() * p.element_size() * (2 + optimizer_floats) for p in params))


def decide(cfg: ParallelConfig, dist: Dist, model: nn.Module, optimizer_floats: float) -> tuple[Dims, str]:
    """Return the layout and the facts it was chosen from. The layout is the config's degrees, or
    for ``parallel=auto`` its data dimension replicated or sharded by measured memory."""
    dims = dist.layout
    if cfg.name != "auto" or dims.batch_degree == 1:
        return dims, ""
    need, free = training_bytes(model, optimizer_floats) // (dims.tp * dims.pp), _free_device_bytes(dist.device)
    gib = 1 << 30
    facts = (
        f"{dist.world_size} processes on {cfg.nnodes} node(s); parameters + gradients + optimizer state "
        f"{need / gib:.2g} GiB vs {free / gib:.3g} GiB free on {dist.device.type}"
    )
    if need <= cfg.auto_memory_share * free or dims.pp > 1:  # (no FSDP of pipeline stages)
        return dims, f"{facts} (fits in {cfg.auto_memory_share:.0%})" if dims.pp == 1 else f"{facts} (pp: replicate)"
    data, shard = dims.batch_degree, dims.batch_degree
    if cfg.nnodes > 1 and data % cfg.nnodes == 0:  # shard inside a node, replicate across nodes (hsdp)
        shard = data // cfg.nnodes
    sharded = replace(dims, dp_replicate=data // shard, dp_shard=shard)
    return sharded, f"{facts} (more than {cfg.auto_memory_share:.0%}: shard)"


def preset(dims: Dims) -> str:
    """Return the name of the data-parallel technique of a layout, for the log line."""
    if dims.shards:
        return "hsdp" if dims.dp_replicate > 1 else "fsdp"
    return "ddp" if dims.dp_replicate > 1 else "none"


def wrap(
    compiled: nn.Module,
    plain: nn.Module,
    cfg: ParallelConfig,
    dist: Dist,
    precision: Precision,
    dims: Dims,
    root: DeviceMesh | None,
) -> tuple[nn.Module, list[Callable[[], None]]]:
    """Put data parallelism around ``compiled``, the JIT's wrapper of ``plain``, along ``dims``' data
    dimension. Return the model to train and what each step calls once its gradients are complete.

    DDP wraps ``compiled``. FSDP shards ``plain`` in place, over the data slice of ``root`` whose
    other slices tensor parallel used, and the JIT's wrapper then calls the sharded model. A
    model split by tensor or pipeline parallel and replicated, with no ``dp_shard``, averages
    its gradients over the replicas after backward. ``precision`` gives DDP and FSDP their AMP
    dtype, and FSDP its fp32 islands."""
    if dims.batch_degree == 1:
        return compiled, []
    if not dims.shards and not dims.splits_model:
        from fwk.strategies.ddp import Replicated

        return Replicated(compiled, cfg, dist, precision.sharded_param_dtype()), []
    assert root is not None, "a mesh for every sharded or split layout"
    if not dims.shards:
        group = root.get_group("dp_replicate")
        return compiled, [lambda: average_grads(plain, group, dims.dp_replicate)]
    from fwk.strategies import fsdp

    if precision.format == "fp16":
        from fwk.config.schema import FP16_SHARDED
        from fwk.errors import UserError

        raise UserError(
            f"parallel {dims.label()} with fp16 (precision={precision.cfg.name}) is not supported: {FP16_SHARDED}; "
            "use precision=bf16 or fp32, or parallel=ddp"
        )
    data = mesh.data_mesh(root, dims)
    islands = precision.fp32_islands()
    units = fsdp.shard(plain, data, precision.sharded_param_dtype(), islands, cfg.reshard_after_forward)
    if dist.is_main:
        dtype = precision.sharded_param_dtype()
        layout = ""
        if precision.channels_last:  # fsdp.shard: FSDP2 shards contiguous parameters only
            layout = "; conv weights contiguous (FSDP shards no other), inputs channels-last"
        logger.info(
            f"parallel={preset(dims)}: mesh {dims.label()}; {len(units)} units ({units[0]}, ...); parameters in "
            f"{dtype or torch.float32} for compute, fp32 master copy and gradient reduction{layout}"
        )
    return fsdp.Sharded(compiled, plain), []


def average_grads(model: nn.Module, group: tdist.ProcessGroup, replicas: int) -> None:
    """Average every gradient over the replicas, in one all-reduce of all of them, flattened.
    For tensor-parallel parameters those are the local shards."""
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    grads = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad for p in model.parameters()]
    grads = [g for g in grads if g is not None]
    if not grads:
        return
    flat = _flatten_dense_tensors(grads)
    tdist.all_reduce(flat, group=group)
    flat /= replicas
    for g, averaged in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
        g.copy_(averaged)
