"""What a method is: a small object the training loop calls at fixed points.

The events follow Composer's. ``prepare`` runs once on the plain model, before any strategy
wraps it. ``attach`` runs once the optimizer is built. ``batch`` runs on each batch of a step,
on the device. ``loss`` runs once, on the loss the step computes. ``after_step`` runs after
each optimizer step. ``evaluated`` gives the module that evaluation and best checkpoints use,
and ``exported`` the weights ``fwk export`` takes from a checkpoint. Those two are the
evaluation-weights protocol (``fwk/engine/evaluate.py``). ``finished`` runs once after the
final evaluation, on every rank, and what it returns goes into ``summary.json``. A method
keeps its state in the checkpoint (``state_dict``), and anything it changes is a function of
the step or of that state, so a resumed run continues exactly.

A method is one file in ``fwk/methods/``: the dataclass of its settings, which checks its own
values (``rules``), beside its class, registered by ``@method``. The registry imports every
file of the package, so adding a method is adding its file. So a method imports no torch at
the top: ``fwk train --cfg`` reads every method's settings without torch.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from fwk.config.methods import METHODS
from fwk.errors import UserError

if TYPE_CHECKING:  # a method's module imports no torch until it runs (``fwk train --cfg`` reads its settings)
    import torch
    from torch import nn

logger = logging.getLogger(__name__)


class Method(ABC):
    name = ""
    tasks: tuple[str, ...] = ("classification", "lm")  # the data tasks it can serve
    reshapes = False  # changes the model's parameters (prune_gradually): its state loads before the model's

    def __init__(self, cfg: Any, max_steps: int) -> None:
        self.cfg, self.max_steps = cfg, max_steps
        self.example: torch.Tensor | None = None  # one input of batch size 1 (set before prepare)

    def prepare(self, model: nn.Module) -> None:
        """Prepare the method once, on the plain model. The weights are on the device and no strategy is applied yet."""
        return None  # a hook: most methods need no set-up

    def attach(
        self, optimizer: torch.optim.Optimizer, model: nn.Module, reshaped: Callable[[int | None], None]
    ) -> None:
        """Attach the method once the optimizer exists, with the plain model being trained and ``reshaped()``.

        A method that replaces parameters calls ``reshaped()`` afterwards with the steps taken, and it
        rebuilds what holds them. The steps are None on a resume, before the checkpoint loads."""
        return None  # a hook: only a method that changes the parameters' shapes needs them

    def batch(self, step: int, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, y

    def after_step(self, step: int, model: nn.Module) -> None:
        """Act after optimizer step ``step``, counted from 0, on the plain model being trained."""
        return None  # a hook: only methods that follow the weights (ema) use it

    def evaluated(self, model: nn.Module) -> AbstractContextManager[nn.Module]:
        """Give the module to evaluate in place of ``model``, for one evaluation."""
        return nullcontext(model)

    @classmethod
    def exported(cls, state: dict[str, Any]) -> dict[str, Any] | None:
        """Return the weights ``fwk export`` takes from a checkpoint's state in place of the model's, or None."""
        return None

    def finished(self, model: nn.Module, validation: Any) -> dict[str, Any] | None:
        """Act once training has ended, after the final evaluation, on every rank, with the module
        evaluation uses and the run's validation (``validation(model)`` evaluates it). Return
        what ``summary.json`` records under the method's name, or None. A method whose state
        changes here has the final checkpoint saved again."""
        return None  # a hook: only a method that calibrates on the trained model (early_exit) uses it

    def loss(self, loss: Any) -> Any:
        """Return the loss the step computes. A method that changes the objective returns its own.

        ``loss`` is a frozen dataclass (``fwk.models.loss.CrossEntropy``), so a method changes it
        with ``dataclasses.replace`` and the methods before it keep theirs.
        """
        return loss

    @abstractmethod
    def describe(self) -> str:
        """Return one line that says what the method does and when. It is said once, at the start of a run."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None  # a method whose behaviour is a function of the step keeps no state


def method(settings: type) -> Callable[[type[Method]], type[Method]]:
    """Register a ``Method`` under its ``name`` with the dataclass of its settings, as a class decorator.
    The settings are ``method.NAME.*``, and the dataclass's ``rules(c)`` checks them."""

    def register(cls: type[Method]) -> type[Method]:
        return METHODS.register(settings, name=cls.name)(cls)

    return register


class Methods:
    """The run's active methods, in the order ``methods`` lists them. The loop calls this object."""

    def __init__(self, names: list[str], cfg: Any, max_steps: int) -> None:
        """Build the methods ``names`` lists. ``cfg`` is the config's ``method`` section, each method's settings."""
        self.active: list[Method] = [METHODS.get(n).builder(getattr(cfg, n), max_steps) for n in names]
        self.load_before_model = any(m.reshapes for m in self.active)  # Resumable: replay shapes, then load

    def prepare(self, model: nn.Module, task: str, example: torch.Tensor | None = None) -> None:
        """Refuse, in one line, a method this model's task cannot serve, then prepare each.
        ``example`` is one input of batch size 1, which a method that traces the model runs."""
        for m in self.active:
            if task not in m.tasks:
                raise UserError(
                    f"methods: {m.name} serves {' and '.join(m.tasks)} recipes, not this {task} model; "
                    f"remove it from methods"
                )
        for m in self.active:
            if example is not None:
                m.example = example
            m.prepare(model)
            logger.info(m.describe())

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

    @contextmanager
    def evaluated(self, model: nn.Module) -> Iterator[nn.Module]:
        """Give the module the active methods evaluate, for one evaluation. For ema it is its average."""
        with ExitStack() as stack:
            for m in self.active:
                model = stack.enter_context(m.evaluated(model))
            yield model

    @staticmethod
    def exported(state: dict[str, Any]) -> dict[str, Any] | None:
        """Return the weights a method that ran gives ``fwk export`` from a checkpoint's state, or None.
        For ema they are the average."""
        for name in METHODS.names():
            weights = METHODS.get(name).builder.exported(state)
            if weights is not None:
                return weights
        return None

    def finished(self, model: nn.Module, validation: Any) -> dict[str, Any]:
        """Return each active method's record of the finished run, by name (empty when none keeps one)."""
        records = {m.name: m.finished(model, validation) for m in self.active}
        return {name: record for name, record in records.items() if record is not None}

    def loss(self, loss: Any) -> Any:
        """Return the loss after every active method's ``loss`` hook, in the order listed."""
        for m in self.active:
            loss = m.loss(loss)
        return loss

    def state_dict(self) -> dict[str, Any]:
        return {m.name: m.state_dict() for m in self.active}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for m in self.active:
            if m.name in state:
                m.load_state_dict(state[m.name])
