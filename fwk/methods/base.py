"""What a method is: a small object the training loop calls at fixed points.

The events (after Composer's): ``prepare`` once on the plain model, before any strategy
wraps it; ``batch`` on each batch of a step, on the device; ``after_step`` after each
optimizer step; ``eval_model``, the module that evaluation, best checkpoints and
``fwk export`` use. A method keeps its state in the checkpoint (``state_dict``), and
anything it changes is a function of the step, so a resumed run continues exactly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import nn


class Method(ABC):
    name = ""
    tasks: tuple[str, ...] = ("classification", "lm")  # the data tasks it can serve

    def __init__(self, cfg: Any, max_steps: int) -> None:
        self.cfg, self.max_steps = cfg, max_steps

    def prepare(self, model: nn.Module) -> None:
        """Once, on the plain model (weights on the device, no strategy applied yet)."""
        return None  # a hook: most methods need no set-up

    def batch(self, step: int, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, y

    def after_step(self, step: int, model: nn.Module) -> None:
        """After optimizer step ``step`` (0-based), with the model being trained (plain)."""
        return None  # a hook: only methods that follow the weights (ema) use it

    def eval_model(self, model: nn.Module) -> nn.Module:
        return model

    def label_smoothing(self) -> float | None:
        return None

    @abstractmethod
    def describe(self) -> str:
        """One line: what the method does and when (said once, at the start of a run)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None  # a method whose behaviour is a function of the step keeps no state
