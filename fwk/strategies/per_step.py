"""What a strategy may do in each training step: the one interface ``TrainStep`` knows.

``TrainStep`` calls each hook on every strategy, in ``decisions.DECISION_ORDER``, and names
none of them. A strategy overrides the hooks it needs, and the rest do nothing. A step runs
them in this order:

- ``begin(step, turn)``: the strategy's setting for the step. ``turn`` says that the
  decisions before its own are made. It returns whether the ones after it may decide now:
  one measured decision at a time, none counting another's trial steps.
- ``around_step()``: a context around the whole step, redone after an out-of-memory error
  (memory=auto times it and takes its peak).
- for each piece of the step's batch (``StepPlan``): ``around_piece()`` around its forward
  and backward (memory's saved tensors), ``around_forward()`` around its forward
  (precision's autocast), ``prepare_input(x)``, and ``scale_loss(loss)`` before backward.
- ``unscale(optimizer)`` before the gradients are clipped, then ``optimizer_step(optimizer)``:
  True when the strategy stepped the optimizer itself (fp16's gradient scaler).
- ``recover(exc)``: after an exception in the step. True when the strategy caused it and
  the step may be redone, as when compiled code failed and the run goes eager from then on.
- ``step_done(step, seconds)``: after the step, with its time.

``trying`` and ``timing`` are asked of every strategy, and hold for the step when any says so.
``trying`` means this step runs a candidate a decision is timing, and the loop redoes it.
``timing`` means step times feed a decision, so a CUDA step is synchronized before it is timed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import torch


class PerStep:
    """The per-step hooks, each a no-op here."""

    def begin(self, step: int, turn: bool = True) -> bool:
        return turn

    @property
    def trying(self) -> bool:
        return False

    @property
    def timing(self) -> bool:
        return False

    def around_step(self) -> AbstractContextManager:
        return contextlib.nullcontext()

    def around_piece(self) -> AbstractContextManager:
        return contextlib.nullcontext()

    def around_forward(self) -> AbstractContextManager:
        return contextlib.nullcontext()

    def prepare_input(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        return None

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        return False

    def recover(self, exc: BaseException) -> bool:
        return False

    def step_done(self, step: int, seconds: float) -> None:
        return None


def overriding(strategies: Sequence[PerStep], hook: str) -> list[Callable]:
    """Return the bound ``hook`` of each strategy that overrides it. The step calls only those, so
    a hook that does nothing costs nothing in the hot path."""
    default = getattr(PerStep, hook)
    return [getattr(s, hook) for s in strategies if getattr(type(s), hook) is not default]


def entered(contexts: Sequence[Callable[[], AbstractContextManager]]) -> AbstractContextManager:
    """Return one context that enters each of ``contexts()`` in order, and leaves them in reverse."""
    if not contexts:
        return contextlib.nullcontext()
    if len(contexts) == 1:
        return contexts[0]()
    stack = contextlib.ExitStack()
    with contextlib.ExitStack() as failing:  # a context that fails to enter leaves the ones before it
        failing.push(stack)
        for context in contexts:
            stack.enter_context(context())
        failing.pop_all()
    return stack
