"""The learning rate of a run whose gradient accumulation is not its recipe's.

Raising ``train.accum_steps`` from k0 to k makes each optimizer step average k/k0 times as
many samples. The gradient's noise then falls by sqrt(k/k0), and the learning rate rises by
that much to keep the step's noise as it was (the square-root rule of large-batch training).
``train.accum_lr=sqrt``, the default, applies it, and the run says so in its first lines.
``train.accum_lr=fixed`` keeps the recipe's rate. A learning rate given on the command line
is the user's and is never scaled.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fwk.config.grammar import typed_keys

KEY = "train.accum_steps"
WARN_ABOVE = 8  # more accumulation than this rarely trains sooner than a larger batch or less memory


@dataclass(frozen=True)
class Scaling:
    """The recipe's accumulation and learning rate, and the run's."""

    steps: int
    recipes_steps: int
    lr: float
    scaled_lr: float

    def line(self) -> str:
        """Say what was scaled, by how much, and how to keep the recipe's rate."""
        return (
            f"{KEY}={self.steps} (the recipe's: {self.recipes_steps}): optim.lr {self.lr:.3g} -> "
            f"{self.scaled_lr:.3g}, scaled by sqrt({self.steps}/{self.recipes_steps}); "
            f"train.accum_lr=fixed keeps {self.lr:.3g}"
        )


def scaling(composed: dict[str, Any], overrides: list[str], compose: Callable[[list[str]], dict]) -> Scaling | None:
    """Return the scaling the composed config asks for, or None when its rate stays.

    ``compose(overrides)`` composes the recipe without the user's accumulation, to read the
    recipe's own accumulation and rate. It runs only when the user set ``train.accum_steps``.
    """
    typed = typed_keys(overrides)
    train, optim = composed["train"], composed["optim"]
    if train["accum_lr"] != "sqrt" or KEY not in typed or "optim.lr" in typed or "lr" not in optim:
        return None
    recipe = compose([o for o in overrides if o.partition("=")[0].lstrip("+~") != KEY])
    before, now = int(recipe["train"]["accum_steps"]), int(train["accum_steps"])
    if now == before or now < 1:  # validation refuses a count below 1 in its own words
        return None
    lr = float(recipe["optim"]["lr"])
    return Scaling(now, before, lr, lr * math.sqrt(now / before))


def warning(steps: int) -> str | None:
    """Return the warning for more than ``WARN_ABOVE`` accumulation steps, or None."""
    if steps <= WARN_ABOVE:
        return None
    return (
        f"fwk: warning: {KEY}={steps} is above {WARN_ABOVE}: every optimizer step waits for {steps} "
        "loader batches, and BatchNorm still sees one at a time; a larger train.batch_size, or "
        "memory=checkpoint to fit it, usually trains sooner"
    )
