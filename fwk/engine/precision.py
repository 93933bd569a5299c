"""Numeric precision: config group ``precision``.

fp32 runs as is; bf16 autocasts the forward pass (weights, gradients and optimizer state
stay fp32, so no loss scaling is needed).
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

import torch

from fwk.config.schema import PrecisionConfig


class Precision:
    def __init__(self, cfg: PrecisionConfig, device: torch.device) -> None:
        self.name = cfg.name
        self.device = device

    def autocast(self) -> AbstractContextManager:
        if self.name == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()
