"""What the loop keeps for itself: the seeds it starts from, the training clock a checkpoint
carries across launches, and the stop request a signal makes."""

from __future__ import annotations

import random
import signal
from typing import Any

import numpy as np
import torch

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
        """Return True when any rank was asked to stop. With several processes this is a collective."""
        return all_reduce_sum([float(self.requested)], dist)[0] > 0

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
