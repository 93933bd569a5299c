"""What a checkpoint holds: the model, the optimizer and the state of every object the loop calls."""

from __future__ import annotations

from typing import Any

import torch

from fwk.components.train_state import load_model_state, model_state, named_model_state


class Resumable:
    """What a checkpoint holds, gathered from its parts and given back to them. That is the
    model and optimizer, whole or this rank's shards, and the state of every object the loop
    calls."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, **parts: Any) -> None:
        self.model, self.optimizer, self.parts = model, optimizer, parts

    def template(self, flat: bool = True) -> dict[str, Any]:
        """Return what a sharded checkpoint loads into on this run's processes and layout.
        ``flat`` keeps the optimizer state as the checkpoint keeps it, one entry per parameter
        and value."""
        return named_model_state(self.model, self.optimizer, flat)

    def state_dict(self, step: int) -> dict[str, Any]:
        parts = {name: part.state_dict() for name, part in self.parts.items()}
        return {**model_state(self.model, self.optimizer), **parts, "step": step}

    def load_state_dict(self, state: dict[str, Any]) -> int:
        """Restore everything and return the step the checkpoint was taken at. A part that
        reshapes the model loads first (``load_before_model``: prune_gradually replays its
        removals), so that the model's weights fit."""
        first = [n for n, part in self.parts.items() if getattr(part, "load_before_model", False)]
        order = [*first, None, *(n for n in self.parts if n not in first)]
        for name in order:
            if name is None:
                load_model_state(self.model, self.optimizer, state)
            elif name in state:  # a checkpoint from before a part existed leaves it as built
                self.parts[name].load_state_dict(state[name])
        return int(state["step"])
