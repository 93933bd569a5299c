"""What the loop keeps across a stop: the seeds, the stop request, and everything a
checkpoint restores (``Resumable``: model, optimizer and the state of every object the
loop calls)."""

from __future__ import annotations

import random
import signal
from typing import Any

import numpy as np
import torch

from fwk.components.checkpoint import load_model_state, model_state, named_model_state
from fwk.distributed.collectives import all_reduce_sum
from fwk.distributed.group import Dist


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Clock:
    """Seconds spent training, over every launch of a run, and when the run reached its
    ``train.stop_at`` target (both kept in the checkpoint): the time to target counts the
    launches before a resume too, and a run stopped at its target does not train on."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.reached: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "reached": self.reached}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seconds, self.reached = float(state["seconds"]), state.get("reached")


class StopSignal:
    """SIGTERM/SIGINT/SIGUSR1/SIGHUP ask the loop to save a checkpoint and stop at the next step boundary.

    SIGUSR1 is a batch system's preemption notice (scripts/slurm/train.sbatch). SLURM signals
    every process of a job step and fwk's launcher forwards it as well, so it may come twice:
    a repeat changes nothing. A second SIGINT/SIGTERM stops at once.
    """

    def __init__(self) -> None:
        self.requested = False
        signals = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP)  # SIGHUP: the terminal closed
        self._previous = {s: signal.signal(s, self._handle) for s in signals}

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        if signum != signal.SIGUSR1:
            signal.signal(signum, self._previous[signum])  # a second Ctrl-C stops at once

    def agreed(self, dist: Dist) -> bool:
        """True when any rank was asked to stop (a collective when distributed)."""
        return all_reduce_sum([float(self.requested)], dist)[0] > 0

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


class Resumable:
    """What a checkpoint holds: the model and optimizer (whole, or this rank's shards) and
    the state of every object the loop calls, gathered from them and given back to them."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, **parts: Any) -> None:
        self.model, self.optimizer, self.parts = model, optimizer, parts

    def template(self, flat: bool = True) -> dict[str, Any]:
        """What a sharded checkpoint loads into, on this run's processes and layout (``flat``:
        the optimizer state as the checkpoint keeps it, one entry per parameter and value)."""
        return named_model_state(self.model, self.optimizer, flat)

    def state_dict(self, step: int) -> dict[str, Any]:
        parts = {name: part.state_dict() for name, part in self.parts.items()}
        return {**model_state(self.model, self.optimizer), **parts, "step": step}

    def load_state_dict(self, state: dict[str, Any]) -> int:
        """Restore everything; returns the step the checkpoint was taken at. A part that
        reshapes the model (``load_before_model``: prune_gradually replays its removals)
        loads first, so that the model's weights fit."""
        first = [n for n, part in self.parts.items() if getattr(part, "load_before_model", False)]
        order = [*first, None, *(n for n in self.parts if n not in first)]
        for name in order:
            if name is None:
                load_model_state(self.model, self.optimizer, state)
            elif name in state:  # a checkpoint from before a part existed leaves it as built
                self.parts[name].load_state_dict(state[name])
        return int(state["step"])
