"""Checks for NaN/Inf, loss spikes and gradient norms during training. This module is the only
reader of the ``diagnostics`` group.

``TrainStep`` calls ``check`` once per optimizer step, after the backward and before the
optimizer, with the step's mean loss. It costs one host sync (the loss) and, with several
processes, one all-reduce of a flag, so that every rank decides alike.

- **Non-finite** loss, or non-finite gradients (without a loss scaler: under fp16 the
  scaler skips such steps itself and they are not failures): the step's update is dropped
  before the optimizer sees it, so the weights stay finite. The step's batches are run
  again on the unwrapped model with hooks to find the first module, in forward order,
  whose output holds NaN/Inf (else the one where the gradient turns non-finite); when
  the re-run is finite, the NaN was transient. One line names the module, the step and a
  suggestion that fits (weights blew up, a norm or softmax, fp16, bad data).
- **Spike** (``spike_k`` > 0): a loss above mean + k std of the last ``spike_window``
  good losses is handled the same way (without the re-run).
- **What then** (``on_nan``): ``skip`` drops the update and goes on; ``rollback`` also
  restores the model, the optimizer and the precision state from the last snapshot (host
  memory, taken every ``snapshot_every`` steps) and scales the learning rate by
  ``lr_factor``; the step counter and the data do not go back, so the batches since the
  snapshot are skipped along with the bad one (PaLM's remedy for its loss spikes);
  ``stop`` ends the run with one line (exit 1), keeping the checkpoints on disk. After
  ``max_rollbacks`` bad steps, rollback and skip stop the same way.
- **Gradient norms** (``grad_stats``): every ``train.log_every`` steps, the norm of each
  top-level module's gradients (a ModuleList counts entry by entry) joins the metrics row.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fwk.components.host_copy import host_copy, host_copy_into
from fwk.components.train_state import load_model_state, model_state
from fwk.config.schema import DiagnosticsConfig
from fwk.distributed.collectives import all_reduce_max
from fwk.distributed.group import Dist
from fwk.errors import UserError
from fwk.strategies.precision import Precision

logger = logging.getLogger(__name__)

_NAN, _SPIKE = 1.0, 2.0
_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._BatchNorm, nn.RMSNorm)
_HUGE = 1e4  # a weight beyond this has blown up (initialized weights are O(1))


class TrainingDiverged(UserError):
    """An error that stops the run with exit 1: the loss or gradients went bad and
    diagnostics.on_nan, or max_rollbacks, says stop."""

    exit_code = 1


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # a DTensor's shard on this rank (FSDP)


def _finite(tensors: Iterable[torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point())


def _tensors(out: Any) -> Iterator[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, (tuple, list)):
        for o in out:
            yield from _tensors(o)
    elif isinstance(out, dict):
        for o in out.values():
            yield from _tensors(o)


@dataclass
class Finding:
    """A finding that says where a non-finite value first appeared in a re-run of the bad step."""

    module: str | None  # None: the re-run was finite (transient), or the batch itself was bad
    where: str  # "output", "gradient", "input" or "transient"
    suggestion: str


def _groups(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """List the top-level modules, with a ModuleList's entries one by one (``blocks.0``,
    ``blocks.1``, ...)."""
    for name, child in model.named_children():
        if isinstance(child, nn.ModuleList):
            for i, entry in enumerate(child):
                yield f"{name}.{i}", entry
        else:
            yield name, child


class Diagnostics:
    def __init__(
        self,
        cfg: DiagnosticsConfig,
        dist: Dist,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        precision: Precision,
        log_every: int,
    ) -> None:
        self.cfg, self.dist, self.model, self.optimizer, self.scheduler = cfg, dist, model, optimizer, scheduler
        self.precision, self.log_every = precision, log_every
        self.losses: deque[float] = deque(maxlen=cfg.spike_window)
        self.bad_steps, self.rollbacks = 0, 0
        self._snapshot: tuple[int, dict[str, Any]] | None = None
        self._grad_row: dict[str, float] = {}

    # --- called by TrainStep ------------------------------------------------------------

    def check(self, step: int, loss: torch.Tensor, rerun: Callable[[], None], trial: bool = False) -> bool:
        """Return True when the optimizer may step. Otherwise the bad step has been handled, or
        this raises. Pass ``trial`` for a trial step (``fwk/components/trials.py``): it is
        redone later, so it is no rollback point."""
        value, grads_finite = self._values(loss)  # the step's one host sync
        kind = 0.0
        if not math.isfinite(value) or not grads_finite:
            kind = _NAN
        elif self._spike(value):
            kind = _SPIKE
        if self.dist.distributed:
            kind = all_reduce_max([kind], self.dist)[0]
        if kind == 0.0:
            self.losses.append(value)
            self._stats(step)
            if self.rolls_back and not trial and (self._snapshot is None or step % self.cfg.snapshot_every == 0):
                self._take_snapshot(step)
            return True
        self._handle(step, kind, value, rerun)
        return False

    @property
    def rolls_back(self) -> bool:
        """Tell whether a bad step restores a snapshot. Only then is one kept, a copy of the
        model and the optimizer state in host memory."""
        return self.cfg.on_nan == "rollback"

    def _values(self, loss: torch.Tensor) -> tuple[float, bool]:
        """Return the loss as a float and whether every gradient is finite, from one copy to the host.

        A norm is finite iff every element of its gradient is, so the loss and one norm per
        gradient go to the host together. The gradients are those the optimizer steps, found
        from its groups rather than by walking the model's modules (which cost more than the
        norms on a small model). Not get_total_norm: its grouping by device and dtype costs
        more too. Under fp16 the scaler finds and skips inf/NaN gradients itself."""
        grads = [] if self.precision.scaling else self._grads()
        if not grads:
            return float(loss), True
        values = torch.stack([loss.detach().reshape(()), *torch._foreach_norm(grads)]).tolist()
        return values[0], all(map(math.isfinite, values[1:]))

    def _grads(self) -> list[torch.Tensor]:
        return [_local(p.grad) for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]

    def _spike(self, value: float) -> bool:
        if self.cfg.spike_k <= 0 or len(self.losses) < self.cfg.spike_window:
            return False
        mean = sum(self.losses) / len(self.losses)
        std = math.sqrt(sum((x - mean) ** 2 for x in self.losses) / (len(self.losses) - 1))
        return value > mean + self.cfg.spike_k * std

    def _stats(self, step: int) -> None:
        if not self.cfg.grad_stats or (step + 1) % self.log_every:
            return
        scale = float(self.precision.loss_scale.value()) if self.precision.scaling else 1.0
        row = {}
        for name, module in _groups(self.model):
            grads = [_local(p.grad) for p in module.parameters() if p.grad is not None]
            if grads:
                row[f"grad_norm/{name}"] = float(torch.nn.utils.get_total_norm(grads)) / scale
        self._grad_row = row

    # --- a bad step -------------------------------------------------------------------------

    def _handle(self, step: int, kind: float, value: float, rerun: Callable[[], None]) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.bad_steps += 1
        n = step + 1  # steps are shown 1-based, as in the metrics rows
        if kind == _NAN:
            found = self.locate(rerun)
            what = f"non-finite loss or gradient at step {n}" + ("" if math.isfinite(value) else f" (loss {value:.4g})")
            if found.module:
                kind_name = type(self.model.get_submodule(found.module)).__name__
                where = f"first non-finite {found.where} in module {found.module} ({kind_name})"
            else:
                where = found.where
            line = f"{what}: {where}; {found.suggestion}"
            line = self._from_other_rank(found, line)
        else:
            mean = sum(self.losses) / len(self.losses)
            line = f"loss spike at step {n}: {value:.4g} against a mean of {mean:.4g} over {len(self.losses)} steps"
        action = self.cfg.on_nan
        if action == "stop":
            raise TrainingDiverged(f"{line}; stopped (diagnostics.on_nan=stop)")
        if self.bad_steps > self.cfg.max_rollbacks:
            raise TrainingDiverged(
                f"{line}; stopped: {self.bad_steps} bad steps, more than diagnostics.max_rollbacks="
                f"{self.cfg.max_rollbacks}"
            )
        if action == "skip":
            logger.info(f"{line}; skipped that batch (diagnostics.on_nan=skip)")
            return
        if self._snapshot is None:  # taken at the first good step: the model as built (or resumed) is bad
            raise TrainingDiverged(
                f"{line}; stopped: no good step of this launch to roll back to (diagnostics.on_nan=rollback)"
            )
        restored = self._restore()
        self.rollbacks += 1
        lr = ""
        if self.cfg.lr_factor != 1.0:
            self.scheduler.base_lrs = [lr * self.cfg.lr_factor for lr in self.scheduler.base_lrs]
            for group in self.optimizer.param_groups:
                group["lr"] *= self.cfg.lr_factor
            lr = f", learning rate x{self.cfg.lr_factor:g}"
        logger.info(
            f"{line}; rolled back to the state of step {restored} (rollback {self.rollbacks} of at most "
            f"{self.cfg.max_rollbacks}{lr}); skipping batches {restored + 1}-{n}"
        )

    def _from_other_rank(self, found: Finding, line: str) -> str:
        """Rank 0 speaks for all: when another rank's batch made the NaN, it says which (and
        that rank writes its own finding into its log, runs/<id>/logs/rank<R>.log)."""
        if not self.dist.distributed:
            return line
        located = found.where != "transient"
        rank = int(all_reduce_max([float(self.dist.rank if located else -1)], self.dist)[0])
        if located and not self.dist.is_main:
            logger.warning(f"rank {self.dist.rank}: {line}")
        if self.dist.is_main and not located and rank > 0:
            return f"{line.split(': ')[0]}: on rank {rank} (its finding is in runs/<id>/logs/rank{rank}.log)"
        return line

    def reshaped(self, steps_taken: int | None) -> None:
        """Take the snapshot again after a method replaced the parameters, as prune_gradually
        does: the old one no longer fits them. It is taken now, after ``steps_taken`` steps.
        None means a resume, before the checkpoint loads, and then the next good step takes it."""
        self._snapshot = None
        if steps_taken is not None and self.rolls_back:
            self._take_snapshot(steps_taken)

    def _take_snapshot(self, step: int) -> None:
        """Keep the state after ``step`` steps, written over the last snapshot's tensors where
        they fit: never two snapshots at once, nor new host memory every ``snapshot_every``."""
        state = {**model_state(self.model, self.optimizer), "precision": self.precision.state_dict()}
        held = self._snapshot[1] if self._snapshot is not None else None
        self._snapshot = None
        self._snapshot = (step, host_copy_into(held, state))

    def _restore(self) -> int:
        """Load the snapshot and return the number of steps it had taken. The optimizer gets
        copies: its load_state_dict keeps the tensors it is given, and the snapshot must stay
        as taken for the next rollback."""
        assert self._snapshot is not None  # _handle stops a launch whose first step is bad
        step, state = self._snapshot
        optimizer = host_copy(state["optimizer"])
        load_model_state(self.model, self.optimizer, {"model": state["model"], "optimizer": optimizer})
        self.precision.load_state_dict(state["precision"])
        return step

    def locate(self, rerun: Callable[[], None]) -> Finding:
        """Re-run the bad step with hooks on every module of the unwrapped model."""
        names = {m: n for n, m in self.model.named_modules() if n}
        order: list[str] = []
        bad_out: list[str] = []
        bad_grad: list[int] = []

        def forward_hook(module: nn.Module, args: Any, out: Any) -> None:
            name = names.get(module)
            if name is None:
                return
            index = len(order)
            order.append(name)
            outs = list(_tensors(out))
            if not _finite(outs):
                bad_out.append(name)
            for t in outs:
                if t.requires_grad:
                    t.register_hook(lambda g, i=index: bad_grad.append(i) if not _finite([g]) else None)

        inputs_bad: list[bool] = []
        handles = [m.register_forward_hook(forward_hook) for m in names]
        pre = self.model.register_forward_pre_hook(lambda m, args: inputs_bad.append(not _finite(_tensors(args))))
        buffers = {n: b.clone() for n, b in self.model.named_buffers()}  # BatchNorm statistics: left as they were
        try:
            rerun()
        except Exception:  # noqa: BLE001 - the re-run is a diagnosis; its own failure must not hide the NaN
            pass
        finally:
            for h in [*handles, pre]:
                h.remove()
            with torch.no_grad():
                for n, b in self.model.named_buffers():
                    b.copy_(buffers[n])
            self.optimizer.zero_grad(set_to_none=True)
        if any(inputs_bad):
            return Finding(None, "in the input", "the batch itself holds NaN/Inf: check the data (fwk data preview)")
        if bad_out:
            return Finding(bad_out[0], "output", self._suggest(bad_out[0]))
        if bad_grad:  # the last module whose output got a bad gradient feeds the one that made it
            last = max(bad_grad)
            name = order[min(last + 1, len(order) - 1)]
            return Finding(name, "gradient", self._suggest(name))
        return Finding(None, "transient", "a re-run of the same batch was finite")

    def _suggest(self, name: str) -> str:
        module = self.model.get_submodule(name)
        weights = [_local(p) for p in module.parameters(recurse=False)]
        largest = max((float(w.detach().abs().max()) for w in weights if w.numel()), default=0.0)
        if weights and (not math.isfinite(largest) or largest > _HUGE):
            return f"its weights blew up (max |w| {largest:.3g}): lower optim.lr or check the init scale"
        if self.precision.format == "fp16":
            return "under fp16: try precision=bf16, or a lower precision.init_scale"
        kind = type(module).__name__
        if isinstance(module, _NORMS) or any(k in kind.lower() for k in ("norm", "softmax", "attention")):
            return f"a {kind} overflows in low precision: keep it in fp32 with precision.keep_fp32=[{name}]"
        if not any(True for _ in module.parameters()):
            return "it has no weights: its forward makes NaN/Inf of finite inputs (a log, sqrt or division at 0?)"
        return "lower optim.lr, or clip the gradients (train.grad_clip=1.0)"

    # --- the loop's view --------------------------------------------------------------------

    def metrics(self) -> dict[str, Any]:
        row, self._grad_row = self._grad_row, {}
        if self.bad_steps:
            row["bad_steps"] = self.bad_steps
        return row

    def summary(self) -> dict[str, Any]:
        return {"bad_steps": self.bad_steps, "rollbacks": self.rollbacks}

    def state_dict(self) -> dict[str, Any]:
        return {"losses": list(self.losses), "bad_steps": self.bad_steps, "rollbacks": self.rollbacks}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.losses.clear()  # also loaded mid-run: after trial steps (fwk/components/trials.py)
        self.losses.extend(state["losses"])
        self.bad_steps, self.rollbacks = int(state["bad_steps"]), int(state["rollbacks"])
