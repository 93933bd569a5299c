"""Pipeline parallelism: the model cut into stages over the ``pp`` slice of the mesh.

The model family cuts itself with ``pipeline_split(n)``: fwk's GPT by block, a user's model by
the method it defines. Hugging Face models are not cut yet. Every stage keeps the plain model's
parameter names, so a checkpoint reshards to any other layout. Rank ``r`` of the pipeline
holds stages ``r, r + pp, ...``, ``parallel.pp_stages_per_rank`` of them, the layout of
torch's looped schedules.

A pipelined step is a step plan of its own: ``torch.distributed.pipelining``'s schedule runs
every micro-batch's forward and backward, and the loss on the last stage. The loss of each
micro-batch is its summed cross-entropy divided once by the step's target count, with the
schedule's own gradient scaling off, so gradients equal those of the mean loss over the
whole step whatever the micro-batches and the accumulation (torchtitan #1733). The step's
loss is then sent to every stage, so that the logged loss and NaN checks agree.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from fwk.config.schema import ParallelConfig
from fwk.distributed.dims import Dims
from fwk.errors import UserError

logger = logging.getLogger(__name__)

SCHEDULES = {  # parallel.pp_schedule -> torch's class name (torch.distributed.pipelining.schedules)
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved_1f1b": "ScheduleInterleaved1F1B",
    "zero_bubble": "ScheduleInterleavedZeroBubble",
}


Split = tuple[nn.Module, list[int], list[nn.Module], list[str]]


def split(model: nn.Module, cfg: ParallelConfig, dims: Dims, rank: int) -> Split:
    """Cut the model into stages. Return this rank's part of the model, its stage indices, its stage
    modules, and the names of the parameters the first and the last stage share, such as a head
    tied to the embedding."""
    n_stages = dims.pp * cfg.pp_stages_per_rank
    cut = getattr(model, "pipeline_split", None)
    if cut is None:
        raise UserError(
            f"parallel.pp={dims.pp}: the model {type(model).__name__} cannot be cut into pipeline stages (fwk's GPT "
            "can; a model of your own needs a pipeline_split(n) method returning n "
            "modules that keep its parameter names); use parallel.pp=1 with ddp, fsdp or tp"
        )
    stages = cut(n_stages)
    first = {id(p) for p in stages[0].parameters()}
    shared = [name for name, p in stages[-1].named_parameters() if id(p) in first] if n_stages > 1 else []
    mine = list(range(dims.coords(rank)["pp"], n_stages, dims.pp))
    local = [stages[i] for i in mine]
    from fwk.models.gpt_parallel import merge

    part = merge(local)
    part.pipeline_part = True  # not the whole model: checkpoints go through torch.distributed.checkpoint
    return part, mine, local, shared


class Pipeline:
    """The pipelined forward and backward of a step's pieces, and evaluation through the stages."""

    def __init__(
        self,
        split: Split,
        cfg: ParallelConfig,
        dims: Dims,
        root: DeviceMesh,
    ) -> None:
        self.part, self.ids, self.stages, self.shared = split
        self.cfg, self.dims = cfg, dims
        self.group = root.get_group("pp")
        self.pp_rank = tdist.get_rank(self.group)
        self.n_stages = dims.pp * cfg.pp_stages_per_rank
        self.first, self.last = 0 in self.ids, self.n_stages - 1 in self.ids
        self.microbatches = cfg.pp_microbatches or 2 * self.n_stages
        self._scale = 1.0
        self._schedule: Any = None
        self.tied = self._tied_group(root)

    # ---- the step --------------------------------------------------------------------------
    def _loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Return a micro-batch's summed cross-entropy, divided once by the step's target count."""
        out = output.reshape(-1, output.size(-1)).float()
        return F.cross_entropy(out, target.reshape(-1), reduction="sum") * self._scale

    def schedule(self, device: torch.device) -> Any:
        """Return the schedule, built at the first step, after every other strategy has wrapped the stages."""
        if self._schedule is None:
            from torch.distributed import pipelining
            from torch.distributed.pipelining import schedules

            made = [
                pipelining.PipelineStage(stage, i, self.n_stages, device, group=self.group)
                for i, stage in zip(self.ids, self.stages, strict=True)
            ]
            kind = getattr(schedules, SCHEDULES[self.cfg.pp_schedule])
            single = issubclass(kind, schedules.PipelineScheduleSingle)
            self._schedule = kind(
                made[0] if single else made, n_microbatches=self.microbatches, loss_fn=self._loss, scale_grads=False
            )
        return self._schedule

    def piece(self, x: torch.Tensor, y: torch.Tensor, weight: float, device: torch.device) -> torch.Tensor:
        """Run forward and backward of one piece, and return the piece's mean loss on every stage.
        ``weight`` is the piece's share of the step's targets."""
        self._scale = weight / y.numel()
        losses: list[torch.Tensor] = []
        args = (x,) if self.first else ()
        self.schedule(device).step(*args, target=y if self.last else None, losses=losses)
        mean = torch.zeros((), device=device)
        if self.last:
            mean = torch.stack([loss.detach() for loss in losses]).sum() / weight
        tdist.all_reduce(mean, group=self.group)  # from the last stage to the others (they add 0)
        return mean

    def grads_ready(self) -> None:
        """Give the parameters the first and the last stage share, such as a tied head, their summed gradient."""
        if self.tied is None or not (self.first or self.last):
            return
        for name in self.shared:
            grad = self.part.get_parameter(name).grad
            if grad is not None:
                tdist.all_reduce(grad.to_local() if hasattr(grad, "to_local") else grad, group=self.tied)

    def uncounted(self) -> list[torch.Tensor]:
        """Return the parameters the gradient norm leaves out here: the last stage's copy of a shared
        one, which is counted on the first stage's rank."""
        if self.tied is None or self.first or not self.last:
            return []
        return [self.part.get_parameter(name) for name in self.shared]

    def _tied_group(self, root: DeviceMesh) -> tdist.ProcessGroup | None:
        """Return the group of the first and the last stage's ranks of this pipeline, when the two
        share parameters and sit on different ranks."""
        first_rank, last_rank = 0, (self.n_stages - 1) % self.dims.pp
        if first_rank == last_rank or not self.shared:
            return None
        everyone = root.mesh.reshape(self.dims.pp, -1)  # (pp, every other coordinate) -> global rank
        mine = None
        for column in range(everyone.shape[1]):  # every rank makes every group, in the same order
            ranks = [int(everyone[first_rank, column]), int(everyone[last_rank, column])]
            group = tdist.new_group(ranks)
            if tdist.get_rank() in ranks:
                mine = group
        return mine

    # ---- evaluation ------------------------------------------------------------------------
    def evaluated(self) -> Evaluated:
        """Return what evaluation calls in place of the model."""
        return Evaluated(self)

    @torch.no_grad()
    def forward_only(self, x: torch.Tensor) -> torch.Tensor | None:
        """Run the stages' forward in order, sending activations from rank to rank. Return the logits
        on the last stage's rank, and None on the others (``fwk/engine/evaluate.py``)."""
        hidden: torch.Tensor | None = x
        owner = lambda i: i % self.dims.pp  # noqa: E731
        for i in range(self.n_stages):
            if owner(i) == self.pp_rank:
                if i > 0 and owner(i - 1) != self.pp_rank:
                    hidden = self._recv(owner(i - 1), x.device)
                hidden = self.stages[self.ids.index(i)](hidden)
                if i < self.n_stages - 1 and owner(i + 1) != self.pp_rank:
                    self._send(hidden, owner(i + 1))
        return hidden if self.last else None

    def _peer(self, pp_rank: int) -> int:
        return tdist.get_global_rank(self.group, pp_rank)

    def _send(self, t: torch.Tensor, to: int) -> None:
        t = t.float().contiguous()
        shape = torch.tensor([t.dim(), *t.shape], dtype=torch.int64, device=t.device)
        tdist.send(torch.tensor([shape.numel()], dtype=torch.int64, device=t.device), self._peer(to), self.group)
        tdist.send(shape, self._peer(to), self.group)
        tdist.send(t, self._peer(to), self.group)

    def _recv(self, source: int, device: torch.device) -> torch.Tensor:
        n = torch.zeros(1, dtype=torch.int64, device=device)
        tdist.recv(n, self._peer(source), self.group)
        shape = torch.zeros(int(n.item()), dtype=torch.int64, device=device)
        tdist.recv(shape, self._peer(source), self.group)
        out = torch.empty(tuple(shape[1:].tolist()), dtype=torch.float32, device=device)
        tdist.recv(out, self._peer(source), self.group)
        return out


class Evaluated(nn.Module):
    """What evaluation calls in place of the model: the pipeline's forward through every stage."""

    def __init__(self, pipeline: Pipeline) -> None:
        super().__init__()
        self.pipeline = pipeline
        self.part = pipeline.part

    def forward(self, x: torch.Tensor) -> torch.Tensor | None:
        return self.pipeline.forward_only(x)
