"""Process group and data parallelism: config group ``parallel``.

Read by the worker once at start (``init``) and to wrap the model (``wrap``), last in the
wrapping order. ``none`` trains one process; ``ddp`` replicates the model (``comm.py``
times and adapts its communication); ``fsdp`` and ``hsdp`` shard it (``fsdp.py``).
``auto`` decides from measured facts and says them in one line: one process -> none;
parameters + gradients + optimizer state within ``auto_memory_share`` of the free memory
of one device -> ddp; otherwise fsdp, or hsdp across nodes.
"""

from __future__ import annotations

import gc
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from fwk.config.schema import ParallelConfig


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


def decide(cfg: ParallelConfig, d: Dist, model: nn.Module, optimizer_floats: float) -> tuple[str, str]:
    """(strategy, the facts it was chosen from) for ``parallel.name``."""
    if cfg.name != "auto":
        return cfg.name, ""
    if not d.distributed:
        return "none", "1 process"
    need, free = training_bytes(model, optimizer_floats), _free_device_bytes(d.device)
    gib = 1 << 30
    facts = (
        f"{d.world_size} processes on {cfg.nnodes} node(s); parameters + gradients + optimizer state "
        f"{need / gib:.2g} GiB vs {free / gib:.3g} GiB free on {d.device.type}"
    )
    if need <= cfg.auto_memory_share * free:
        return "ddp", f"{facts} (fits in {cfg.auto_memory_share:.0%})"
    return ("hsdp" if cfg.nnodes > 1 else "fsdp"), f"{facts} (more than {cfg.auto_memory_share:.0%}: shard)"


def wrap(
    model: nn.Module,
    raw: nn.Module,
    cfg: ParallelConfig,
    d: Dist,
    precision: Any,
    optimizer_floats: float,
    say: Callable[[str], None],
) -> nn.Module:
    """Apply data parallelism on top of ``model`` (``raw`` after the JIT's wrapper).

    DDP wraps ``model``; FSDP shards ``raw`` in place (the JIT's wrapper then calls the
    sharded model). ``precision`` gives FSDP its parameter dtype and fp32 islands.
    """
    strategy, facts = decide(cfg, d, raw, optimizer_floats)
    if d.is_main and cfg.name == "auto":
        say(f"parallel=auto chose {strategy}: {facts}")
    if strategy == "none" or not d.distributed:
        return model
    if strategy == "ddp":
        from fwk.engine.comm import Replicated

        amp = precision.sharded_param_dtype()
        return Replicated(model, cfg, d, amp)
    from fwk.engine import fsdp

    if precision.format == "fp16":
        from fwk.errors import UserError

        raise UserError(
            f"parallel={strategy} with fp16 (precision={precision.cfg.name}) is not supported: its loss "
            "scaler sees only this rank's gradient shard; use precision=bf16 or fp32, or parallel=ddp"
        )
    shard_size = (cfg.shard_size or cfg.nproc_per_node) if strategy == "hsdp" else None
    mesh = fsdp.mesh(d.device, d.world_size, shard_size)
    units = fsdp.shard(raw, mesh, precision.sharded_param_dtype(), precision.fp32_islands(), cfg.reshard_after_forward)
    if d.is_main:
        dtype = precision.sharded_param_dtype()
        shape = " x ".join(f"{n}={s}" for n, s in zip(mesh.mesh_dim_names or (), mesh.shape, strict=True))
        layout = ""
        if precision.channels_last:  # fsdp.shard: FSDP2 shards contiguous parameters only
            layout = "; conv weights contiguous (FSDP shards no other), inputs channels-last"
        say(
            f"parallel={strategy}: mesh {shape}; {len(units)} units ({units[0]}, ...); parameters in "
            f"{dtype or torch.float32} for compute, fp32 master copy and gradient reduction{layout}"
        )
    return fsdp.Sharded(model, raw)


def model_state(raw: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Model and optimizer state to checkpoint: full tensors, or this rank's shards (FSDP)."""
    from fwk.engine import fsdp

    if fsdp.is_sharded(raw):
        return fsdp.model_state(raw, optimizer)
    return {"model": raw.state_dict(), "optimizer": optimizer.state_dict()}


def load_model_state(raw: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    from fwk.engine import fsdp

    if fsdp.is_sharded(raw):
        fsdp.load_model_state(raw, optimizer, state)
    else:
        raw.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])


def sharded(raw: nn.Module) -> bool:
    from fwk.engine import fsdp

    return fsdp.is_sharded(raw)


_EXPLICIT_S = [0.0]  # time spent in this module's explicit collectives (read by comm.py)


def explicit_collective_seconds() -> float:
    return _EXPLICIT_S[0]


def _all_reduce(values: list[float], d: Dist, op: dist.ReduceOp.RedOpType) -> list[float]:
    t0 = time.perf_counter()
    t = torch.tensor(values, dtype=torch.float64, device=d.device)
    dist.all_reduce(t, op=op)
    out = t.tolist()
    _EXPLICIT_S[0] += time.perf_counter() - t0
    return out


def all_reduce_sum(values: list[float], d: Dist) -> list[float]:
    """Sum floats over ranks (one small collective; a CPU-GPU sync point on CUDA)."""
    if not d.distributed:
        return values
    return _all_reduce(values, d, dist.ReduceOp.SUM)


def replicas_in_sync(model: nn.Module, d: Dist) -> bool:
    """Whether every rank holds bit-identical parameters (a check for desync bugs; sharded
    parameters are gathered whole first)."""
    if not d.distributed:
        return True
    from fwk.engine.fsdp import full_tensor

    digest = hashlib.sha256()
    for p in model.parameters():
        whole = full_tensor(p.detach())
        digest.update(whole.cpu().contiguous().view(torch.uint8).numpy().tobytes())
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
        gc.collect()  # DDP's reducer sits in a reference cycle: free it while its group still runs
        dist.barrier()
        dist.destroy_process_group()


def all_reduce_max(values: list[float], d: Dist) -> list[float]:
    """Elementwise max of floats over ranks, so every rank takes the same decision."""
    if not d.distributed or not values:
        return values
    return _all_reduce(values, d, dist.ReduceOp.MAX)
