"""Data parallelism: config group ``parallel``.

``wrap`` is called by ``parallelize.py``; the process group itself is ``fwk.distributed``.
``none`` trains one process; ``ddp`` replicates the model (``ddp.py`` times and adapts its
communication); ``fsdp`` and ``hsdp`` shard it (``fsdp.py``). ``auto`` decides from
measured facts and says them in one line: one process -> none; parameters + gradients +
optimizer state within ``auto_memory_share`` of the free memory of one device -> ddp;
otherwise fsdp, or hsdp across nodes.
"""

from __future__ import annotations

import logging
import os

import torch
from torch import nn

from fwk.config.schema import ParallelConfig
from fwk.distributed.group import Dist
from fwk.strategies.precision import Precision

logger = logging.getLogger(__name__)


def _free_device_bytes(device: torch.device) -> int:
    """Free memory of one device: the GPU's, or this process's share of the host's."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with open("/proc/meminfo") as f:
        available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    return available // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def training_bytes(model: nn.Module, optimizer_floats: float) -> int:
    """Parameters + gradients + optimizer state of an unsharded model, in bytes.

    ``optimizer_floats``: optimizer state elements per parameter element (AdamW 2, Lion 1).
    """
    params = list(model.parameters())
    return int(sum(p.numel() * p.element_size() * (2 + optimizer_floats) for p in params))


def decide(cfg: ParallelConfig, dist: Dist, model: nn.Module, optimizer_floats: float) -> tuple[str, str]:
    """(strategy, the facts it was chosen from) for ``parallel.name``."""
    if cfg.name != "auto":
        return cfg.name, ""
    if not dist.distributed:
        return "none", "1 process"
    need, free = training_bytes(model, optimizer_floats), _free_device_bytes(dist.device)
    gib = 1 << 30
    facts = (
        f"{dist.world_size} processes on {cfg.nnodes} node(s); parameters + gradients + optimizer state "
        f"{need / gib:.2g} GiB vs {free / gib:.3g} GiB free on {dist.device.type}"
    )
    if need <= cfg.auto_memory_share * free:
        return "ddp", f"{facts} (fits in {cfg.auto_memory_share:.0%})"
    return ("hsdp" if cfg.nnodes > 1 else "fsdp"), f"{facts} (more than {cfg.auto_memory_share:.0%}: shard)"


def wrap(
    compiled: nn.Module,
    plain: nn.Module,
    cfg: ParallelConfig,
    dist: Dist,
    precision: Precision,
    optimizer_floats: float,
) -> nn.Module:
    """The model to train: data parallelism around ``compiled`` (the JIT's wrapper of ``plain``).

    DDP wraps ``compiled``; FSDP shards ``plain`` in place, and the JIT's wrapper then calls
    the sharded model. ``precision`` gives both their AMP dtype, and FSDP its fp32 islands.
    """
    strategy, facts = decide(cfg, dist, plain, optimizer_floats)
    if dist.is_main and cfg.name == "auto":
        logger.info(f"parallel=auto chose {strategy}: {facts}")
    if strategy == "none" or not dist.distributed:
        return compiled
    if strategy == "ddp":
        from fwk.strategies.ddp import Replicated

        amp = precision.sharded_param_dtype()
        return Replicated(compiled, cfg, dist, amp)
    from fwk.strategies import fsdp

    if precision.format == "fp16":
        from fwk.config.schema import FP16_SHARDED
        from fwk.errors import UserError

        raise UserError(
            f"parallel={strategy} with fp16 (precision={precision.cfg.name}) is not supported: {FP16_SHARDED}; "
            "use precision=bf16 or fp32, or parallel=ddp"
        )
    shard_size = (cfg.shard_size or cfg.nproc_per_node) if strategy == "hsdp" else None
    mesh = fsdp.mesh(dist.device, dist.world_size, shard_size)
    islands = precision.fp32_islands()
    units = fsdp.shard(plain, mesh, precision.sharded_param_dtype(), islands, cfg.reshard_after_forward)
    if dist.is_main:
        dtype = precision.sharded_param_dtype()
        shape = " x ".join(f"{n}={s}" for n, s in zip(mesh.mesh_dim_names or (), mesh.shape, strict=True))
        layout = ""
        if precision.channels_last:  # fsdp.shard: FSDP2 shards contiguous parameters only
            layout = "; conv weights contiguous (FSDP shards no other), inputs channels-last"
        logger.info(
            f"parallel={strategy}: mesh {shape}; {len(units)} units ({units[0]}, ...); parameters in "
            f"{dtype or torch.float32} for compute, fp32 master copy and gradient reduction{layout}"
        )
    return fsdp.Sharded(compiled, plain)
