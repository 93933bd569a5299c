"""The training loss: mean cross-entropy, computed in fp32.

Images give (N, classes) logits, and tokens give (B, T, vocab). Both are flattened to rows.
With ``fused``, set when kernels' chunked head loss is installed, the model computes the loss
itself from the targets and never holds the whole logits tensor. A method changes the loss
through its ``loss`` hook: ``methods=[label_smoothing]`` sets ``label_smoothing``, and
``methods=[early_exit]`` replaces it with ``ExitLoss``, which adds the exits' losses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class CrossEntropy:
    label_smoothing: float = 0.0
    fused: bool = False

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return model(x, targets=y, label_smoothing=self.label_smoothing)
        logits = model(x)
        return F.cross_entropy(
            logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1), label_smoothing=self.label_smoothing
        )


@dataclass(frozen=True)
class ExitLoss(CrossEntropy):
    """The loss of ``methods=[early_exit]``: the weighted mean of the exits' and the final
    output's cross-entropies, ``(sum_k w_k CE_k + CE_final) / (sum_k w_k + 1)``. ``exits`` is the
    method, which holds the heads and what the last forward left at each exit."""

    exits: Any = None

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = model(x)
        target = y.reshape(-1)
        losses = [
            F.cross_entropy(z.reshape(-1, z.size(-1)).float(), target, label_smoothing=self.label_smoothing)
            for z in (*self.exits.exit_logits(), logits)
        ]
        weights = [*self.exits.weights, 1.0]
        return sum(w * loss for w, loss in zip(weights, losses, strict=True)) / sum(weights)
