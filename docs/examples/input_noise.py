"""A method of your own: one file in a ``fwk/methods/`` folder on ``PYTHONPATH``.

Saved as ``my_methods/fwk/methods/input_noise.py``, it trains with:

    PYTHONPATH=my_methods fwk train methods=[input_noise] method.input_noise.std=0.05
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fwk.methods.base import Method, method
from fwk.registry import doc


@dataclass
class InputNoiseConfig:
    """Gaussian noise on the inputs over the first part of training."""

    std: float = doc(0.1, "standard deviation of the noise, in input units")
    until: float = doc(0.5, "share of train.max_steps that gets noise")

    def rules(self, c: Any) -> Iterator[tuple[bool, str, Any, str]]:  # (holds, key, value, allowed)
        yield self.std >= 0, "method.input_noise.std", self.std, "a number >= 0"
        yield 0 <= self.until <= 1, "method.input_noise.until", self.until, "a share in [0, 1]"


@method(InputNoiseConfig)
class InputNoise(Method):
    name = "input_noise"
    tasks = ("classification",)

    def batch(self, step, x, y):
        import torch  # where it runs: `fwk train --cfg` reads every method's settings without torch

        if step >= self.cfg.until * self.max_steps:
            return x, y
        return x + self.cfg.std * torch.randn_like(x), y

    def describe(self) -> str:
        return f"input_noise: std {self.cfg.std:g} on the inputs until step {round(self.cfg.until * self.max_steps)}"
