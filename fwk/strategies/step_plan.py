"""How one optimizer step's global batch is split: the one object the loop and the step ask.

A step takes ``accum_steps`` loader batches and cuts each into ``micro_batches`` pieces. Each
piece runs forward and backward, and the gradients add up (``fwk/engine/step.py``). What
sets the two numbers:

- ``accum_steps``: ``train.accum_steps``, times ``factor`` on a run resumed by fewer
  processes than wrote it. Each keeps its per-process batch and accumulates more, so the
  global batch holds (``fwk/distributed/resize.py``). DDP's communication adaptation doubles
  it (``accumulate_more``), and its checkpoint state carries that.
- ``micro_batches``: memory's plan, from memory=microbatch or memory=auto's trial plans and its
  choice. After an out-of-memory error it is memory's next plan: ``out_of_memory`` asks for it,
  then the step is redone with the same batches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from fwk.strategies.memory import Memory

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class Split:
    """What a step does otherwise when the model is split over ranks by tensor or pipeline parallel.

    ``fwk/strategies/parallelize.py`` makes it. By default it does nothing."""

    # (inputs, targets, the piece's share of the step's targets, device) -> the piece's mean
    # loss, its backward done: a pipeline schedule's forward and backward
    piece: Callable[[torch.Tensor, torch.Tensor, float, torch.device], torch.Tensor] | None = None
    grads_ready: list[Callable[[], None]] = field(default_factory=list)  # after the last backward
    norm_params: Callable[[], list[torch.Tensor]] | None = None  # clipped across ranks (DTensors, stages)
    norm_across: tuple[Any, ...] = ()  # process groups whose ranks hold different parameters
    uncounted: Callable[[], list[torch.Tensor]] = list  # scaled, but counted in the norm elsewhere


class StepPlan:
    def __init__(self, accum_steps: int, memory: Memory, factor: int = 1) -> None:
        """Hold ``accum_steps``, the config's, with ``factor`` already in it."""
        self.accum_steps, self.memory, self.factor = accum_steps, memory, factor

    @property
    def micro_batches(self) -> int:
        return self.memory.plan.micro_batches

    def pieces(self, batches: list[Batch]) -> list[Batch]:
        """Return the step's loader batches, each cut into the current number of micro-batches."""
        n = self.micro_batches
        if n == 1:
            return list(batches)
        return [p for x, y in batches for p in zip(torch.tensor_split(x, n), torch.tensor_split(y, n), strict=False)]

    def out_of_memory(self, step: int) -> None:
        """Move to memory's next plan after a step that ran out of memory, or raise a one-line error."""
        self.memory.retry_after_oom(step)

    def accumulate_more(self, limit: int) -> str | None:
        """Double the accumulation, up to ``limit``, and return what changed, or None at the limit."""
        if self.accum_steps >= limit:
            return None
        before, self.accum_steps = self.accum_steps, min(self.accum_steps * 2, limit)
        return f"raised gradient accumulation {before} -> {self.accum_steps} steps"

    def resume(self, written: int) -> None:
        """Restore the accumulation a checkpoint recorded, its launch's as adapted, on this launch's processes."""
        self.accum_steps = written * self.factor
