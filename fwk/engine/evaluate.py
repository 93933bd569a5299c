"""Evaluation of the weights the run's evaluation-weights sources give (``EvalWeights``), on
this rank's validation shard and summed over ranks."""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from fwk.distributed.collectives import all_reduce_max, all_reduce_sum
from fwk.distributed.group import Dist
from fwk.distributed.sharded import is_sharded
from fwk.strategies.precision import Precision


class EvalWeights(Protocol):
    """Weights that evaluation, best checkpoints and ``fwk export`` use in place of the ones
    being trained. A method gives them, as ema gives its average, or an optimizer, as
    schedule-free gives its ``x``."""

    def evaluated(self, model: nn.Module) -> AbstractContextManager[nn.Module]:
        """Give the module to evaluate in place of ``model`` for one evaluation, and put
        training's weights back after."""
        ...

    @staticmethod
    def exported(state: dict[str, Any]) -> dict[str, Any] | None:
        """Return the weights ``fwk export`` takes from a checkpoint's state, or None."""
        ...


@torch.no_grad()
def evaluate(
    model: nn.Module, loader: DataLoader, precision: Precision, task: str, dist: Dist, max_batches: int
) -> dict[str, float]:
    """Return the mean loss per target, a token or an image, plus accuracy or perplexity.

    ``model`` is the unwrapped module (under pipeline parallel, the stages' forward: logits on
    the last stage, None before it): ranks may hold shards that differ by one batch,
    and DDP's forward would wait for a collective the shorter rank never joins. A sharded
    (FSDP) model gathers its parameters in every forward, so there the shorter ranks run
    extra forwards on a batch they already saw and do not count them.
    """
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=dist.device)
    correct = torch.zeros((), dtype=torch.float64, device=dist.device)
    count = 0
    local = min(len(loader), max_batches) if max_batches else len(loader)
    lockstep = int(all_reduce_max([float(local)], dist)[0]) if is_sharded(model) else local
    x = None
    reports = dist.layout.reports(dist.rank)  # one rank per batch counts it (tensor and pipeline parallel)
    for i, (x, y) in enumerate(loader):
        if i >= local:
            break
        x, y = x.to(dist.device, non_blocking=True), y.to(dist.device, non_blocking=True)
        with precision.autocast():
            logits = model(x)
        if logits is None or not reports:  # a pipeline stage before the last; a peer's copy
            continue
        logits = logits.reshape(-1, logits.size(-1)).float()  # (N, classes): images or tokens
        target = y.reshape(-1)
        loss_sum += F.cross_entropy(logits, target, reduction="sum").double()
        correct += (logits.argmax(-1) == target).sum().double()
        count += target.numel()
    for _ in range(lockstep - local):
        x = x if x is not None else loader.dataset[0][0].unsqueeze(0)
        with precision.autocast():
            model(x.to(dist.device))
    total_loss, total_correct, total = all_reduce_sum([loss_sum.item(), correct.item(), float(count)], dist)
    model.train(was_training)
    loss = total_loss / max(total, 1.0)
    if task == "lm":
        return {"val_loss": loss, "val_ppl": math.exp(min(loss, 50.0))}
    return {"val_loss": loss, "val_acc": total_correct / max(total, 1.0)}
