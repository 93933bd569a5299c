"""Small collectives on Python floats, the time they take, and whole-tensor helpers.

``all_reduce_sum`` / ``all_reduce_max`` make every rank take the same decision: stop,
roll back, compile or not. The seconds they spend are counted in the run's
``Dist.collective_s``, so that the DDP communication monitor can tell its own all-reduces
from these.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import torch
import torch.distributed as tdist
from torch import nn

from fwk.distributed.group import Dist
from fwk.distributed.sharded import is_dtensor


def _all_reduce(values: list[float], dist: Dist, op: tdist.ReduceOp.RedOpType) -> list[float]:
    t0 = time.perf_counter()
    t = torch.tensor(values, dtype=torch.float64, device=dist.device)
    tdist.all_reduce(t, op=op)
    out = t.tolist()
    dist.collective_s.total += time.perf_counter() - t0
    return out


def all_reduce_sum(values: list[float], dist: Dist) -> list[float]:
    """Sum floats over ranks in one small collective. On CUDA it is a CPU-GPU sync point."""
    if not dist.distributed:
        return values
    return _all_reduce(values, dist, tdist.ReduceOp.SUM)


def all_reduce_max(values: list[float], dist: Dist) -> list[float]:
    """Take the elementwise max of floats over ranks, so every rank takes the same decision."""
    if not dist.distributed or not values:
        return values
    return _all_reduce(values, dist, tdist.ReduceOp.MAX)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """Return the whole tensor of a DTensor, which is a collective, or else ``t`` itself."""
    return t.full_tensor() if is_dtensor(t) else t


def replicas_in_sync(model: nn.Module, dist: Dist, group: tdist.ProcessGroup | None = None) -> bool:
    """Check whether every rank holds bit-identical parameters, to catch desync bugs. Sharded
    parameters are gathered whole first. ``group`` is the ranks that hold the same part of a
    model split by tensor or pipeline parallel, its data-parallel peers. Without it, every rank."""
    if not dist.distributed:
        return True
    digest = hashlib.sha256()
    for p in model.parameters():
        whole = full_tensor(p.detach())
        digest.update(whole.cpu().contiguous().view(torch.uint8).numpy().tobytes())
    digests: list[str] = [""] * tdist.get_world_size(group)
    tdist.all_gather_object(digests, digest.hexdigest(), group=group)
    return len(set(digests)) == 1


def broadcast_object(value: object, dist: Dist) -> object:
    """Return rank 0's ``value`` on every rank. It is a picklable object, such as a decision read from a cache."""
    if not dist.distributed:
        return value
    box = [value]
    tdist.broadcast_object_list(box, src=0, device=dist.device if dist.device.type == "cuda" else None)
    return box[0]


def all_gather_objects(value: object, dist: Dist) -> list[object]:
    """Return every rank's ``value``, in rank order: a picklable object, such as a few CPU tensors."""
    if not dist.distributed:
        return [value]
    gathered: list[object] = [None] * dist.world_size
    tdist.all_gather_object(gathered, value)
    return gathered


def clip_grad_norm_(
    params: list[torch.Tensor],
    max_norm: float,
    across: tuple[tdist.ProcessGroup, ...] = (),
    uncounted: list[torch.Tensor] = (),  # type: ignore[assignment]
) -> torch.Tensor:
    """Clip as ``torch.nn.utils.clip_grad_norm_`` does, for parameters split over ranks, and return the total norm.

    DTensor shards (tensor parallel, FSDP) add their squares over the mesh dimensions they are
    sharded on. Whole tensors, which are replicated, count once. ``across`` sums over the groups
    whose ranks hold different parameters: the pipeline stages. ``uncounted`` are parameters
    scaled with the rest but left out of the norm, such as a second copy of a tied weight,
    counted on the rank of its first.

    It runs one small all-reduce per group of placements, not one per parameter."""
    from torch.distributed.tensor.placement_types import Shard, _StridedShard

    grads = [p.grad for p in params if p.grad is not None]
    skip = {id(p.grad) for p in uncounted}
    device = grads[0].device if grads else torch.device("cpu")
    whole = torch.zeros((), dtype=torch.float64, device=device)
    partial: dict[tuple[int, tuple[int, ...]], tuple[Any, torch.Tensor]] = {}
    for g in (g for g in grads if id(g) not in skip):
        if is_dtensor(g):
            dims = tuple(i for i, pl in enumerate(g.placements) if isinstance(pl, (Shard, _StridedShard)))
            local = g.to_local()
            square = torch.linalg.vector_norm(local, dtype=torch.float64) ** 2
            if not dims:
                whole += square
                continue
            mesh, acc = partial.setdefault((id(g.device_mesh), dims), (g.device_mesh, torch.zeros_like(whole)))
            acc += square
        else:
            whole += torch.linalg.vector_norm(g, dtype=torch.float64) ** 2
    total = whole
    for (_, dims), (mesh, acc) in partial.items():
        for d in dims:
            tdist.all_reduce(acc, group=mesh.get_group(d))
        total = total + acc
    for group in across:
        tdist.all_reduce(total, group=group)
    norm = total.sqrt()
    coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for g in grads:
        (g.to_local() if is_dtensor(g) else g).mul_(coef.to(g.dtype))
    return norm


def grads_laid_out_as_params(model: nn.Module) -> None:
    """Register hooks that give each DTensor parameter's gradient its parameter's placements.
    DTensor's embedding backward gives a vocabulary-split table's gradient replicated: each rank
    gets the whole table's. Taking this rank's rows is local. The optimizer, the gradient norm
    and the pipeline's sum of a tied weight's copies then see each shard with its own rows."""
    for param in model.parameters():
        if is_dtensor(param) and param.requires_grad:
            param.register_hook(_laid_out_as(param))


def _laid_out_as(param: Any) -> Any:  # a DTensor
    mesh, placements = param.device_mesh, param.placements

    def hook(grad: torch.Tensor) -> torch.Tensor:
        if is_dtensor(grad) and grad.placements != placements:
            return grad.redistribute(mesh, placements)
        return grad

    return hook
