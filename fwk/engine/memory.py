"""Memory strategies: config group ``memory``. ``none`` keeps every activation."""

from __future__ import annotations

from torch import nn

from fwk.config.schema import MemoryConfig


def apply(model: nn.Module, cfg: MemoryConfig) -> nn.Module:
    """Wrap the plain model for the chosen strategy (first in the wrapping order)."""
    if cfg.name == "none":
        return model
    raise ValueError(f"memory strategy {cfg.name!r} is not known to the engine")
