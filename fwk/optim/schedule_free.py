"""``optim=adamw_schedulefree``: the ``schedulefree`` package's AdamW, and what the loop does around it.

That AdamW is Defazio et al.'s, from "The Road Less Scheduled". Schedule-free AdamW needs no
decay schedule. It trains at a point ``y`` between a fast iterate ``z``, kept in its state,
and their running average ``x``, and ``x`` is the model to evaluate and ship. The package
asks its users to switch the parameters between the two with ``optimizer.train()`` and
``optimizer.eval()``. For BatchNorm models it also asks them to recompute the norms'
statistics at ``x`` before evaluating. ``AveragedPoint`` does both around every evaluation,
in ``evaluated``, the evaluation-weights protocol of ``fwk/engine/evaluate.py``.

An evaluation puts the parameters and buffers back bit for bit afterwards, not through
``optimizer.train()``'s inverse lerp, which rounds. So it leaves no trace in training, and a
run stopped before an evaluation resumes exactly. Checkpoints hold the parameters in train
mode (``y``), and beside them ``x`` as ``eval_weights``, which best checkpoints and
``fwk export`` use. ``x`` is computed out of place, with the buffers of the last evaluation.
Warmup comes from ``schedule.warmup_steps`` through the usual scheduler, and the decay is
constant.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from fwk.optim import is_schedule_free


def _eval_point(optimizer: torch.optim.Optimizer) -> dict[int, torch.Tensor]:
    """Return each trained parameter's ``x``, out of place.

    It is ``optimizer.eval()``'s lerp, without touching the parameter:
    ``x = y + (1 - 1/beta1) (z - y)``."""
    points = {}
    for group in optimizer.param_groups:
        beta1 = group["betas"][0]
        for p in group["params"]:
            z = optimizer.state.get(p, {}).get("z")
            if z is not None:
                points[id(p)] = torch.lerp(p.detach(), z.to(p.device), 1.0 - 1.0 / beta1)
    return points


class AveragedPoint:
    """The averaged point that each evaluation sees: the parameters at ``x``, then back at ``y``.

    At ``x``, BatchNorm statistics are recomputed on ``bn_batches`` training batches. They are
    the same on every rank, in a fixed order, so replicas agree and a resumed run sees the same.
    With any other optimizer it does nothing, and ``active`` is False."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        model: nn.Module,
        calibration: Callable[[], Iterable[tuple[torch.Tensor, torch.Tensor]]],
        bn_batches: int,
        autocast: Callable[[], Any],
    ) -> None:
        self.optimizer, self.model, self.calibration = optimizer, model, calibration
        self.bn_batches, self.autocast = bn_batches, autocast
        self.active = is_schedule_free(optimizer)
        self.eval_buffers: dict[str, torch.Tensor] = {}  # the buffers of the last evaluation (BatchNorm's at x)
        self.norms = [m for m in model.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]

    def start(self) -> None:
        """Switch the optimizer to train mode before the first step.

        A resumed optimizer is in it already."""
        if self.active:
            self.optimizer.train()

    @contextmanager
    def evaluated(self, model: nn.Module) -> Iterator[nn.Module]:
        """Yield ``model`` at ``x`` for one evaluation, then put it back at ``y``.

        ``model`` is the model this was made with."""
        if not self.active:
            yield model
            return
        kept = [t.detach().clone() for t in self._tensors()]  # y and the running statistics, bit for bit
        self.optimizer.eval()
        try:
            self._recompute_norms()
            self.eval_buffers = {name: b.detach().clone() for name, b in self.model.named_buffers()}
            yield model
        finally:  # back exactly as before: an evaluation leaves no trace in training (nor in a resume)
            with torch.no_grad():
                for t, saved in zip(self._tensors(), kept, strict=True):
                    t.copy_(saved)
            for group in self.optimizer.param_groups:
                group["train_mode"] = True

    def _tensors(self) -> list[torch.Tensor]:
        return [*self.model.parameters(), *self.model.buffers()]

    @torch.no_grad()
    def _recompute_norms(self) -> None:
        if not self.norms or not self.bn_batches:
            return
        momenta = [m.momentum for m in self.norms]
        for m in self.norms:
            m.reset_running_stats()
            m.momentum = None  # a cumulative average over the calibration batches
        was_training = self.model.training
        self.model.train()
        try:
            for i, (x, _) in enumerate(self.calibration()):
                if i >= self.bn_batches:
                    break
                with self.autocast():
                    self.model(x)
        finally:
            self.model.train(was_training)
            for m, momentum in zip(self.norms, momenta, strict=True):
                m.momentum = momentum

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Return the model at ``x``, for export.

        It holds the parameters averaged and the buffers of the last evaluation, which are the
        BatchNorm statistics at ``x``. Before any evaluation they are the training ones."""
        points = _eval_point(self.optimizer)
        state = {}
        for name, p in self.model.named_parameters():
            state[name] = points.get(id(p), p.detach()).clone()
        for name, b in self.model.named_buffers():
            state[name] = self.eval_buffers.get(name, b).detach().clone()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None  # derived from the parameters and the optimizer's state: nothing to restore

    @staticmethod
    def exported(state: dict[str, Any]) -> dict[str, Any] | None:
        """Return the ``x`` weights in a checkpoint's state, which ``fwk export`` exports, or None."""
        return state.get("eval_weights") or None
