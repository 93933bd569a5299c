"""One optimizer step: gradient accumulation, micro-batches, precision, OOM retry.

A step consumes ``train.accum_steps`` loader batches; the memory plan may split each into
micro-batches. Each piece's loss is weighted by its share of the step's targets, so the
summed gradient is the gradient of the mean loss over the whole step, as one big batch
would give. DDP all-reduces gradients only on the last piece (``no_sync`` before).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from fwk.config.schema import TrainConfig
from fwk.engine.memory import Memory
from fwk.engine.parallel import Dist
from fwk.engine.precision import Precision

Batch = tuple[torch.Tensor, torch.Tensor]


class TrainStep:
    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        precision: Precision,
        memory: Memory,
        cfg: TrainConfig,
        d: Dist,
    ) -> None:
        self.model, self.optimizer, self.precision, self.memory = model, optimizer, precision, memory
        self.cfg, self.d = cfg, d

    def __call__(self, step: int, batches: list[Batch]) -> torch.Tensor:
        """Run the step; returns the detached mean loss. An OOM redoes it with the same data."""
        self.precision.begin(step)
        while True:
            try:
                with self.memory.measure():
                    return self._run(batches)
            except torch.cuda.OutOfMemoryError:  # also raised by CPU tests that simulate it
                self.optimizer.zero_grad(set_to_none=True)
                self.memory.retry_after_oom(step)

    def _run(self, batches: list[Batch]) -> torch.Tensor:
        device = self.d.device
        pieces = [p for x, y in batches for p in self.memory.split(x, y)]
        total = sum(y.numel() for _, y in pieces)
        loss_sum = torch.zeros((), device=device)
        for i, (x, y) in enumerate(pieces):
            weight = y.numel() / total
            last = i == len(pieces) - 1
            no_sync = getattr(self.model, "no_sync", None)
            with contextlib.nullcontext() if last or no_sync is None else no_sync(), self.memory.saved_tensors():
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                with self.precision.autocast():
                    logits = self.model(self.precision.input(x))
                # (N, classes) for images, (B*T, vocab) for tokens; the loss in fp32 for stability.
                loss = F.cross_entropy(
                    logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1), label_smoothing=self.cfg.label_smoothing
                )
                self.precision.backward(loss if weight == 1.0 else loss * weight)
            loss_sum += loss.detach() * weight
        self.precision.step(self.optimizer, self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.zero_grad(set_to_none=True)
        return loss_sum
