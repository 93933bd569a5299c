"""What rank 0 shows and records: metrics.jsonl rows, and a progress bar or plain lines
(through fwk's logger, ``fwk/log.py``).

Loss values are summed on the device and read once per log window: reading a CUDA
tensor is a sync point, so it happens every ``train.log_every`` steps, not every step.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from fwk.components.sinks import Tracking
from fwk.distributed.collectives import all_reduce_sum
from fwk.distributed.group import Dist
from fwk.log import terminal

logger = logging.getLogger(__name__)


class Window:
    """The sums of one log window: loss sum (on device), samples, step and data-wait time."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.loss_sum = torch.zeros((), device=self.device, dtype=torch.float64)
        self.finite = torch.zeros((), device=self.device, dtype=torch.float64)
        self.steps, self.data_wait, self.start = 0, 0.0, time.perf_counter()

    def state_dict(self) -> dict[str, Any]:
        """Return what the window has summed. Its start time is left out, since its rate counts
        all time spent."""
        return {"loss_sum": self.loss_sum.clone(), "finite": self.finite.clone(), "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loss_sum, self.finite, self.steps = state["loss_sum"], state["finite"], state["steps"]

    def add(self, loss: torch.Tensor, data_wait: float) -> None:
        # a step whose loss was not finite was dropped (fwk/components/diagnostics.py): it does not count
        loss = loss.detach().double()
        finite = torch.isfinite(loss)
        self.loss_sum += torch.where(finite, loss, 0.0)
        self.finite += finite
        self.steps += 1
        self.data_wait += data_wait

    def close(self, global_batch: int, dist: Dist) -> dict[str, float]:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        loss_sum, finite = all_reduce_sum([self.loss_sum.item(), self.finite.item()], dist)
        loss = loss_sum / finite if finite else float("nan")
        row = {
            "loss": loss,
            "samples_per_s": self.steps * global_batch / elapsed,
            "data_wait": min(1.0, self.data_wait / elapsed),
        }
        self.reset()
        return row


QUIET = ("train_s",)  # in metrics.jsonl and the sinks, not in the console line (fwk runs plot --x time reads it)


def _fmt(key: str, value: Any) -> str:
    if key == "lr":
        return f"lr {value:.2e}"
    if key in ("data_wait", "comm_wait"):
        return f"{key.replace('_', '-')} {value:.0%}"
    if key == "loss_scale":
        return f"scale {value:.0f}"
    if key == "samples_per_s":
        return f"{value:,.0f} samples/s"
    return f"{key} {value:.4f}" if isinstance(value, float) else f"{key} {value}"


class Reporter:
    """The rank-0 reporter. It writes metrics.jsonl, forwards every row to the tracking sinks
    (TensorBoard, MLflow) and shows progress, and it does nothing on ranks other than 0."""

    def __init__(self, path: Path, dist: Dist, max_steps: int, tracking: Tracking | None = None) -> None:
        self.enabled = dist.is_main
        self.path, self.max_steps, self.tracking = path, max_steps, tracking
        self.console = terminal() if self.enabled else None  # the report lines' terminal, if theirs is one
        self.tty = self.console is not None
        self._bar = None

    def start(self, step: int) -> None:
        """Open the tracking sinks and show the progress bar from ``step`` on, on a TTY only.
        fwk's report lines (``fwk/log.py``) print above it, through the same rich console."""
        if self.tracking is not None:
            self.tracking.start(step)
        if self.tty:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(
                TextColumn("[bold]train"),
                BarColumn(bar_width=24),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeRemainingColumn(),
                console=self.console,
                transient=False,
            )
            self._task = self._bar.add_task("train", total=self.max_steps, completed=step, info="")
            self._bar.start()

    def log(self, step: int, row: dict[str, Any], kind: str = "train") -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, "kind": kind, **row}) + "\n")
        if self.tracking is not None:
            self.tracking.log(step, row, kind)
        text = "  ".join(_fmt(k, v) for k, v in row.items() if k not in QUIET)
        if self._bar is not None:
            if kind == "train":  # the bar shows the two numbers that fit a narrow terminal
                info = f"loss {row['loss']:.4f}  {row['samples_per_s']:,.0f} samples/s"
                self._bar.update(self._task, completed=step, info=info)
            else:
                logger.info(f"step {step:>6}  eval  {text}")  # above the bar: the log's console is the bar's
        else:
            logger.info(f"step {step:>6}/{self.max_steps}  {kind:<5} {text}")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
