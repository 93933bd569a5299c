"""Models that go wrong on purpose, importable by the `fwk` subprocess
(model=custom model._target_=tests.components.nan_models.PoisonedCNN +model.at=12)."""

from __future__ import annotations

import os

import torch
from torch import nn

from fwk.models.cnn import SmallCNN


class Poison(nn.Module):
    """The identity, except on its ``at``-th and next training forward (the bad step and the
    re-run that locates it): NaN everywhere. With ``rank`` >= 0, only on that rank."""

    def __init__(self, at: int, rank: int = -1) -> None:
        super().__init__()
        self.at, self.rank, self.calls = at, rank, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        self.calls += 1
        here = self.rank < 0 or int(os.environ.get("RANK", "0")) == self.rank
        return x * float("nan") if here and self.calls in (self.at, self.at + 1) else x


class PoisonedCNN(SmallCNN):
    """fwk's small_cnn with a Poison between its features and its head."""

    def __init__(self, at: int, rank: int = -1, **kwargs: int) -> None:
        super().__init__(
            **{"in_channels": 1, "channels1": 16, "channels2": 32, "hidden": 64, "num_classes": 10, **kwargs}
        )
        self.poison = Poison(at, rank)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.poison(self.features(x)))


class SqrtOfZero(nn.Module):
    """Returns its input, plus sqrt(x - x) = 0: a finite forward whose backward is NaN (inf x 0)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.sqrt(x - x)
