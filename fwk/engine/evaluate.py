"""Evaluation of the weights the run's evaluation-weights sources give (``EvalWeights``), on
this rank's validation shard and summed over ranks.

A model with exit heads (``methods=[early_exit]``, ``fwk/models/exits.py``) is evaluated
through them with a ``threshold``: each sample takes the first exit whose softmax entropy is
below it. Without one, evaluation is the full model's, as in training. ``exit_samples``
gathers each exit's entropy and score per sample, which the threshold is calibrated on.
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from fwk.distributed.collectives import all_gather_objects, all_reduce_max, all_reduce_sum
from fwk.distributed.group import Dist
from fwk.distributed.sharded import is_sharded
from fwk.models.exits import entropy, exit_logits, exit_outputs
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
    model: nn.Module,
    loader: DataLoader,
    precision: Precision,
    task: str,
    dist: Dist,
    max_batches: int,
    threshold: float | None = None,
) -> dict[str, float]:
    """Return the mean loss per target, a token or an image, plus accuracy or perplexity.
    With ``threshold``, the model's exit heads give each sample's logits (``exit_logits``).

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
            logits = model(x) if threshold is None else exit_logits(model, x, threshold)[0]
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


@dataclass(frozen=True)
class Validation:
    """The run's validation: its batches and how it evaluates them. Called with a model (and
    a threshold for its exits), it returns ``evaluate``'s metrics."""

    loader: Any
    precision: Precision
    task: str
    dist: Dist
    max_batches: int

    def __call__(self, model: nn.Module, threshold: float | None = None) -> dict[str, float]:
        return evaluate(model, self.loader, self.precision, self.task, self.dist, self.max_batches, threshold)

    def exit_samples(self, model: nn.Module) -> ExitSamples:
        """The exits' entropies and scores on the validation set (``exit_samples``): methods,
        a floor below the engine, reach it through the ``Validation`` they are handed."""
        return exit_samples(model, self)


@dataclass
class ExitSamples:
    """Each exit's softmax entropy and each exit's and the final output's score, per sample
    (a token of an LM) of the validation set. The score is 1.0 or 0.0 for a right or wrong
    class, or the cross-entropy of a token."""

    entropy: torch.Tensor  # (exits, N) float64
    score: torch.Tensor  # (exits + 1, N) float64: the final output's is the last row


@torch.no_grad()
def exit_samples(model: nn.Module, validation: Validation) -> ExitSamples:
    """Return the exits' entropies and scores on the whole validation set, gathered from every
    rank's shard. The model is whole on each rank (early_exit refuses FSDP, tp and pp)."""
    was_training = model.training
    model.eval()
    v = validation
    local = min(len(v.loader), v.max_batches) if v.max_batches else len(v.loader)
    entropies, scores = [], []
    for i, (x, y) in enumerate(v.loader):
        if i >= local:
            break
        x, y = x.to(v.dist.device, non_blocking=True), y.to(v.dist.device, non_blocking=True)
        with v.precision.autocast():
            outputs = exit_outputs(model, x)
        target = y.reshape(-1)
        rows = [z.reshape(-1, z.size(-1)) for z in outputs]  # (N, classes) each: images or tokens
        entropies.append(torch.stack([entropy(z) for z in rows[:-1]]).double().cpu())
        if v.task == "lm":
            score = [F.cross_entropy(z, target, reduction="none") for z in rows]
        else:
            score = [(z.argmax(-1) == target).float() for z in rows]
        scores.append(torch.stack(score).double().cpu())
    model.train(was_training)
    parts = all_gather_objects((entropies, scores), v.dist)  # every rank's shard, in rank order
    return ExitSamples(
        torch.cat([e for es, _ in parts for e in es], dim=1), torch.cat([s for _, ss in parts for s in ss], dim=1)
    )
