"""This process's place in the job: ``Dist``, the device, joining and leaving the process group.

The ground floor of fwk's engine (as torchtitan's ``distributed/utils.py``): everything
that runs on more than one process stands on it, and it imports nothing of fwk above it.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from fwk.distributed.dims import Dims
from fwk.errors import UserError


@dataclass
class Seconds:
    """A running total of seconds, one per run. ``Dist.collective_s`` is one."""

    total: float = 0.0


@dataclass(frozen=True)
class Dist:
    """This process's place in the job, for one run.

    ``collective_s`` counts the seconds this run spent in fwk's own small collectives
    (``fwk/distributed/collectives.py``), so that the DDP communication monitor can tell
    its all-reduces from these."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    collective_s: Seconds = field(default_factory=Seconds, compare=False, repr=False)
    dims: Dims | None = None  # the layout (None: every process data-parallel)

    @property
    def layout(self) -> Dims:
        """Return the job's degrees (``fwk/distributed/dims.py``). The device mesh is ``mesh.py``'s."""
        return self.dims if self.dims is not None else Dims(dp_replicate=self.world_size)

    @property
    def batch_degree(self) -> int:
        """Return how many different batches a step takes. The loaders split the data by it."""
        return self.layout.batch_degree

    @property
    def batch_rank(self) -> int:
        """Return which of them this process takes. Tensor-parallel peers and pipeline stages share one."""
        return self.layout.batch_rank(self.rank)

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
        raise UserError("train.device='cuda' but no CUDA device is visible; use train.device=auto or cpu")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def init(backend: str, device_choice: str, timeout_s: float = 600, layout: Callable[[int], Dims] | None = None) -> Dist:
    """Join the process group torchrun set up (RANK/WORLD_SIZE in the environment), if any.

    ``backend`` is ``parallel.backend``: auto is nccl on CUDA, gloo on CPU. ``timeout_s`` is how
    long a collective waits for a peer (``parallel.collective_timeout_s``). ``layout`` gives the
    degrees the config asks for on a number of processes, since an elastic run may have fewer
    than it was launched with."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_choice, local_rank)
    if world > 1 and not dist.is_initialized():
        backend = backend if backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
        timeout = timedelta(seconds=timeout_s)
        dist.init_process_group(
            backend, store=_attempt_store(rank, world, timeout), rank=rank, world_size=world, timeout=timeout
        )
    dims = layout(world) if layout is not None else None
    return Dist(rank, local_rank, world, device, dims=dims)


def _attempt_store(rank: int, world: int, timeout: timedelta) -> dist.Store:
    """Return torchrun's store, with a key prefix per restart of the worker group.

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


def shutdown(clean: bool) -> None:
    """Leave the process group after a clean finish. Every rank first waits for the others,
    so that none tears its communication threads down while a peer still talks to it. Without
    that, gloo aborted with "terminate called without an active exception" at exit, under load.

    After a failure the group is left as it is: a peer may be dead, and tearing the group
    down can block on it, which kept a worker alive that torchrun waited for."""
    if dist.is_initialized() and clean:
        gc.collect()  # DDP's reducer sits in a reference cycle: free it while its group still runs
        dist.barrier()
        dist.destroy_process_group()
