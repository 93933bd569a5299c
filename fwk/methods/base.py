"""What a method is: a small object the training loop calls at fixed points.

The events (after Composer's): ``prepare`` once on the plain model, before any strategy
wraps it; ``attach`` once the optimizer is built; ``batch`` on each batch of a step, on
the device; ``after_step`` after each optimizer step; ``eval_model``, the module that
evaluation, best checkpoints and ``fwk export`` use. A method keeps its state in the
checkpoint (``state_dict``), and anything it changes is a function of the step or of that
state, so a resumed run continues exactly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


class Method(ABC):
    name = ""
    tasks: tuple[str, ...] = ("classification", "lm")  # the data tasks it can serve
    reshapes = False  # changes the model's parameters (prune_gradually): its state loads before the model's

    def __init__(self, cfg: Any, max_steps: int) -> None:
        self.cfg, self.max_steps = cfg, max_steps
        self.example: torch.Tensor = torch.zeros(0)  # one input of batch size 1 (set before prepare)
        self.say: Callable[[str], None] = print  # rank 0's report lines (set before prepare)

    def prepare(self, model: nn.Module) -> None:
        """Once, on the plain model (weights on the device, no strategy applied yet)."""
        return None  # a hook: most methods need no set-up

    def attach(
        self, optimizer: torch.optim.Optimizer, model: nn.Module, reshaped: Callable[[int | None], None]
    ) -> None:
        """Once the optimizer exists: the plain model being trained, and ``reshaped()``, which a
        method that replaces parameters calls after, with the steps taken (None: on a resume,
        before the checkpoint loads); it rebuilds what holds them."""
        return None  # a hook: only a method that changes the parameters' shapes needs them

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
