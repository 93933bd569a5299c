"""fp16's dynamic loss scaling (``torch.amp.GradScaler``) and the steps it skipped.

``fit`` makes the scaler once fp16 may run: asked for, auto's choice, or auto's trial. A step
with inf/NaN gradients is skipped by the scaler and counted. The count and the scaler's state
are part of precision's checkpoint state, so resume is exact.
"""

from __future__ import annotations

from typing import Any

import torch

from fwk.config.schema import PrecisionConfig


class LossScale:
    def __init__(self, cfg: PrecisionConfig, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        self.scaler: torch.amp.GradScaler | None = None
        self.skipped = torch.zeros((), dtype=torch.int64, device=device)

    def fit(self) -> None:
        if self.scaler is None:
            self.scaler = torch.amp.GradScaler(
                self.device.type,
                init_scale=self.cfg.init_scale,
                growth_factor=self.cfg.growth_factor,
                backoff_factor=self.cfg.backoff_factor,
                growth_interval=self.cfg.growth_interval,
            )

    @property
    def fitted(self) -> bool:
        return self.scaler is not None

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        assert self.scaler is not None
        return self.scaler.scale(loss)

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        assert self.scaler is not None
        self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Take the scaler's step. It is skipped, and counted, when the gradients hold inf/NaN."""
        assert self.scaler is not None
        before = self.value().clone()
        self.scaler.step(optimizer)
        self.scaler.update()
        self.skipped += (self.value() < before).long()  # the scale backs off exactly on a skipped step

    def value(self) -> torch.Tensor:
        """Return the current scale as the device tensor. Reading it needs no sync."""
        assert self.scaler is not None
        scale = getattr(self.scaler, "_scale", None)
        return scale if isinstance(scale, torch.Tensor) else torch.tensor(self.scaler.get_scale())

    def metrics(self) -> dict[str, Any]:
        return {"loss_scale": float(self.value()), "skipped_steps": int(self.skipped)} if self.fitted else {}

    def state_dict(self) -> dict[str, Any]:
        """Return the state under precision's own keys, ``skipped`` and ``scaler``, as checkpoints hold them."""
        return {"skipped": int(self.skipped), "scaler": self.scaler.state_dict() if self.scaler is not None else {}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.skipped.fill_(int(state["skipped"]))
        if self.scaler is not None and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
