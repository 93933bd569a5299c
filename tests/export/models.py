"""Models for the export tests, importable by the `fwk` subprocess (model._target_=tests.export.models.X)."""

from __future__ import annotations

import torch
from torch import nn

from fwk.models.cnn import SmallCNN


class ValueGate(nn.Module):
    """Doubles its input when the batch's sum is positive: control flow on a tensor's value."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # torch.export cannot capture this branch
            return x * 2
        return x


class GatedCNN(SmallCNN):
    """fwk's small_cnn (same weights, same state_dict) with a ValueGate after its features:
    it trains like any model and fails to export, at `gate`."""

    def __init__(self, **kwargs: int) -> None:
        super().__init__(**kwargs)
        self.gate = ValueGate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.gate(self.features(x)))
