"""The training loss: mean cross-entropy, computed in fp32.

Images give (N, classes) logits, and tokens give (B, T, vocab). Both are flattened to rows.
With ``fused``, set when kernels' chunked head loss is installed, the model computes the loss
itself from the targets and never holds the whole logits tensor. A method changes the loss
through its ``loss`` hook: ``methods=[label_smoothing]`` sets ``label_smoothing``.
"""

from __future__ import annotations

from dataclasses import dataclass

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
