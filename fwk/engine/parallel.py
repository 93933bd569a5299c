"""Process group and data parallelism: config group ``parallel``.

Read by the worker once at start (``init``) and to wrap the model (``wrap``). ``auto``
chooses DDP when more than one process trains, and says so.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from fwk.config.schema import ParallelConfig

log = logging.getLogger("fwk")


@dataclass(frozen=True)
class Dist:
    """This process's place in the job."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()


def pick_device(choice: str, local_rank: int) -> torch.device:
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        from fwk.errors import UserError

        raise UserError("train.device='cuda' but no CUDA device is visible; use train.device=auto or cpu")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def init(cfg: ParallelConfig, device_choice: str) -> Dist:
    """Join the process group torchrun set up (RANK/WORLD_SIZE in the environment), if any."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_choice, local_rank)
    if world > 1 and not dist.is_initialized():
        backend = cfg.backend if cfg.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
        timeout = timedelta(minutes=10)
        dist.init_process_group(
            backend, store=_attempt_store(rank, world, timeout), rank=rank, world_size=world, timeout=timeout
        )
    return Dist(rank, local_rank, world, device)


def _attempt_store(rank: int, world: int, timeout: timedelta) -> dist.Store:
    """torchrun's store, with a key prefix per restart of the worker group.

    torchrun keeps one store across elastic restarts; without the prefix a restarted rank
    can read the address a dead rank of the previous attempt published and wait on it
    until the connect times out ("Gloo connectFullMesh failed ... Connection refused").
    """
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world,
        is_master=rank == 0 and not agent_store,
        timeout=timeout,
    )
    return dist.PrefixStore(f"fwk/attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def wrap(model: nn.Module, cfg: ParallelConfig, d: Dist) -> nn.Module:
    """Apply data parallelism on top of the plain model (last in the wrapping order)."""
    strategy = cfg.name if cfg.name != "auto" else ("ddp" if d.distributed else "none")
    if d.is_main and cfg.name == "auto":
        log.info("parallel=auto chose %s: %d process(es)", strategy, d.world_size)
    if strategy == "none" or not d.distributed:
        return model
    ids = [d.device.index] if d.device.type == "cuda" else None
    ddp = DistributedDataParallel(
        model,
        device_ids=ids,
        find_unused_parameters=cfg.find_unused_parameters,
        bucket_cap_mb=cfg.bucket_cap_mb,
        gradient_as_bucket_view=cfg.gradient_as_bucket_view,
        static_graph=cfg.static_graph,
    )
    _register_comm_hook(ddp, cfg)
    return ddp


def _register_comm_hook(ddp: DistributedDataParallel, cfg: ParallelConfig) -> None:
    """Gradient compression from torch.distributed.algorithms.ddp_comm_hooks.

    fp16 / bf16 halve the bytes of each all-reduce (the average is cast back); PowerSGD
    sends a rank-``powersgd_rank`` approximation with error feedback. All ranks still end
    each step with the same gradient, so replicas stay identical.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if cfg.comm_hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif cfg.comm_hook == "bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif cfg.comm_hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=cfg.powersgd_rank,
            start_powerSGD_iter=cfg.powersgd_start,
        )
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)


def all_reduce_sum(values: list[float], d: Dist) -> list[float]:
    """Sum floats over ranks (one small collective; a CPU-GPU sync point on CUDA)."""
    if not d.distributed:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=d.device)
    dist.all_reduce(t)
    return t.tolist()


def replicas_in_sync(model: nn.Module, d: Dist) -> bool:
    """Whether every rank holds bit-identical parameters (a check for DDP desync bugs)."""
    if not d.distributed:
        return True
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    digests: list[str] = [""] * d.world_size
    dist.all_gather_object(digests, digest.hexdigest())
    return len(set(digests)) == 1


def shutdown(clean: bool) -> None:
    """Leave the process group after a clean finish: every rank first waits for the others,
    so that none tears its communication threads down while a peer still talks to it (gloo
    aborted with "terminate called without an active exception" at exit, under load).

    After a failure the group is left as it is: a peer may be dead, and tearing the group
    down can block on it, which kept a worker alive that torchrun waited for."""
    if dist.is_initialized() and clean:
        dist.barrier()
        dist.destroy_process_group()


def all_reduce_max(values: list[float], d: Dist) -> list[float]:
    """Elementwise max of floats over ranks, so every rank takes the same decision."""
    if not d.distributed or not values:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=d.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()
