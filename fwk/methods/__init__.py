"""Speed-up methods (``methods=[ema,seq_warmup]``; settings ``method.NAME.*``): small
objects the loop calls at fixed points (``base.Method``), without naming any of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fwk.config.methods import MethodConfig
from fwk.errors import UserError
from fwk.methods.base import Method
from fwk.methods.ema import Ema
from fwk.methods.prune import PruneGradually
from fwk.methods.schedules import LabelSmoothing, ProgressiveResize, SeqWarmup

REGISTRY: dict[str, type[Method]] = {
    m.name: m for m in (Ema, LabelSmoothing, SeqWarmup, ProgressiveResize, PruneGradually)
}


class Methods:
    """The run's active methods, in the order ``methods`` lists them; what the loop calls."""

    def __init__(self, names: list[str], cfg: MethodConfig, max_steps: int) -> None:
        self.active = [REGISTRY[n](getattr(cfg, n), max_steps) for n in names]
        self.load_before_model = any(m.reshapes for m in self.active)  # Resumable: replay shapes, then load

    def prepare(
        self, model: nn.Module, task: str, say: Callable[[str], None], example: torch.Tensor | None = None
    ) -> None:
        """Refuse a method this model's task cannot serve (one line), then prepare each.
        ``example``: one input of batch size 1 (what a method that traces the model runs)."""
        for m in self.active:
            if task not in m.tasks:
                raise UserError(
                    f"methods: {m.name} serves {' and '.join(m.tasks)} recipes, not this {task} model; "
                    f"remove it from methods"
                )
        for m in self.active:
            m.say = say
            if example is not None:
                m.example = example
            m.prepare(model)
            say(m.describe())

    def attach(
        self, optimizer: torch.optim.Optimizer, model: nn.Module, reshaped: Callable[[int | None], None]
    ) -> None:
        for m in self.active:
            m.attach(optimizer, model, reshaped)

    def batch(self, step: int, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for m in self.active:
            x, y = m.batch(step, x, y)
        return x, y

    def after_step(self, step: int, model: nn.Module) -> None:
        for m in self.active:
            m.after_step(step, model)

    def eval_model(self, model: nn.Module) -> nn.Module:
        for m in self.active:
            model = m.eval_model(model)
        return model

    def label_smoothing(self) -> float:
        """The cross-entropy's label smoothing: methods=[label_smoothing]'s, else none."""
        found = [s for m in self.active if (s := m.label_smoothing()) is not None]
        return found[-1] if found else 0.0

    def state_dict(self) -> dict[str, Any]:
        return {m.name: m.state_dict() for m in self.active}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for m in self.active:
            if m.name in state:
                m.load_state_dict(state[m.name])
