"""``label_smoothing``: cross-entropy against smoothed targets (classification). It sets
the smoothing on the step's loss through the ``loss`` hook, as any method may."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fwk.config.methods import Config, Rule
from fwk.methods.base import Method, method
from fwk.registry import doc


@dataclass
class LabelSmoothingConfig:
    """Cross-entropy against smoothed targets, for classification."""

    smoothing: float = doc(0.1, "share of the target's mass spread over the other classes, in (0, 1)")

    def rules(self, c: Config) -> Iterator[Rule]:
        yield 0 < self.smoothing < 1, "method.label_smoothing.smoothing", self.smoothing, "a number in (0, 1)"


@method(LabelSmoothingConfig)
class LabelSmoothing(Method):
    name = "label_smoothing"
    tasks = ("classification",)

    def loss(self, loss: Any) -> Any:
        return dataclasses.replace(loss, label_smoothing=self.cfg.smoothing)

    def describe(self) -> str:
        return f"label_smoothing: cross-entropy against targets smoothed by {self.cfg.smoothing:g}"
