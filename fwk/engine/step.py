"""One optimizer step: the step plan's pieces, the strategies' per-step hooks, the OOM redo.

A step consumes ``StepPlan.accum_steps`` loader batches, each cut into the plan's
micro-batches. Each piece's loss is weighted by its share of the step's targets, so the
summed gradient is the gradient of the mean loss over the whole step, as one big batch
would give. DDP all-reduces gradients only on the last piece (``no_sync`` before). What
the strategies do in a step (autocast, loss scaling, saved tensors, timing a decision,
recovering from a failed compile) comes through their ``PerStep`` hooks
(``fwk/strategies/per_step.py``); the step names none of them.

The parts of a step are labelled for ``torch.profiler`` (``fwk.data``: the copy to the
device, ``fwk.forward``, ``fwk.backward``, ``fwk.optimizer``): ``fwk profile`` splits the
step by them. A label is only opened while a profiler records (half a microsecond to ask).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.profiler import record_function

from fwk.components.diagnostics import Diagnostics
from fwk.distributed.collectives import clip_grad_norm_
from fwk.distributed.group import Dist
from fwk.strategies.per_step import PerStep, entered, overriding
from fwk.strategies.step_plan import Batch, Split, StepPlan

Loss = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]  # (model, inputs, targets) -> mean loss


def label(name: str) -> contextlib.AbstractContextManager:
    """Open a ``record_function`` range while a profiler records, and do nothing otherwise. A
    range costs several microseconds even with no profiler, which is too much for a fast GPU
    step four times over."""
    return record_function(name) if torch._C._autograd._profiler_enabled() else contextlib.nullcontext()


class TrainStep:
    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        strategies: Sequence[PerStep],
        plan: StepPlan,
        loss: Loss,
        grad_clip: float,
        dist: Dist,
        diagnostics: Diagnostics | None = None,
        split: Split | None = None,
    ) -> None:
        """Set up the step. ``strategies`` come in the order they decide
        (``decisions.DECISION_ORDER``). ``plan`` says how the step's batches are split,
        ``model`` is the model to train, and ``split`` is what a layout that splits the model
        changes."""
        self.model, self.optimizer, self.strategies, self.plan, self.loss = model, optimizer, strategies, plan, loss
        self.grad_clip, self.dist, self.diagnostics = grad_clip, dist, diagnostics
        self.split = split if split is not None else Split()
        # the hooks each strategy overrides, looked up once (the rest do nothing)
        self._around_step = overriding(strategies, "around_step")
        self._around_piece = overriding(strategies, "around_piece")
        self._around_forward = overriding(strategies, "around_forward")
        self._inputs = overriding(strategies, "prepare_input")
        self._scale = overriding(strategies, "scale_loss")
        self._unscale = overriding(strategies, "unscale")
        self._optimizer_step = overriding(strategies, "optimizer_step")
        self._recover = overriding(strategies, "recover")
        self._done = overriding(strategies, "step_done")
        self._begun: int | None = None

    def begin(self, step: int) -> None:
        """Give each strategy its setting for the step, and say whose turn it is to decide. The
        loop calls it before drawing the step's batches, and a trial's snapshot is taken then.
        When the loop does not, the step calls it itself."""
        turn = True
        for strategy in self.strategies:  # one decision at a time; none counts another's trial steps
            turn = strategy.begin(step, turn)
        self._begun = step

    @property
    def trying(self) -> bool:
        """Tell whether this step is a trial step. It runs a candidate a decision is timing,
        which a run that recalled the decision would not run, so ``fwk/components/trials.py``
        redoes it."""
        return any(s.trying for s in self.strategies)

    def __call__(self, step: int, batches: list[Batch]) -> torch.Tensor:
        """Run the step and return the detached mean loss. An OOM, or an error a strategy
        recovers from such as a failed compilation, redoes it with the same data."""
        if self._begun != step:
            self.begin(step)
        self._begun = None
        while True:
            t0 = time.perf_counter()
            out_of_memory = False
            try:
                with entered(self._around_step):
                    loss = self._run(step, batches)
            except torch.cuda.OutOfMemoryError:  # also raised by CPU tests that simulate it
                out_of_memory = True
            except Exception as exc:
                if not any(recover(exc) for recover in self._recover):
                    raise
                self.optimizer.zero_grad(set_to_none=True)
                continue
            if out_of_memory:
                # out here, not in the except block: its traceback's frames hold the failed
                # step's activations, which the redo needs freed
                self.optimizer.zero_grad(set_to_none=True)
                self.plan.out_of_memory(step)
                continue
            if self.dist.device.type == "cuda" and any(s.timing for s in self.strategies):
                torch.cuda.synchronize(self.dist.device)  # only while a decision is timing steps
            seconds = time.perf_counter() - t0
            for done in self._done:
                done(step, seconds)
            return loss

    def _forward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for prepare in self._inputs:
            x = prepare(x)
        with entered(self._around_forward):
            return self.loss(model, x, y)

    def _run(self, step: int, batches: list[Batch]) -> torch.Tensor:
        device = self.dist.device
        pieces = self.plan.pieces(batches)
        total = sum(y.numel() for _, y in pieces)
        loss_sum: torch.Tensor | None = None
        for i, (x, y) in enumerate(pieces):
            weight = y.numel() / total
            last = i == len(pieces) - 1
            no_sync = getattr(self.model, "no_sync", None)
            with contextlib.nullcontext() if last or no_sync is None else no_sync(), entered(self._around_piece):
                with label("fwk.data"):
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                if self.split.piece is not None:  # the schedule runs forward and backward
                    with label("fwk.pipeline"), entered(self._around_forward):
                        loss = self.split.piece(x, y, weight, device)
                else:
                    with label("fwk.forward"):
                        loss = self._forward(self.model, x, y)
                    with label("fwk.backward"):
                        scaled = loss if weight == 1.0 else loss * weight
                        for scale in self._scale:
                            scaled = scale(scaled)
                        scaled.backward()
            part = loss.detach().float()  # the step's loss in fp32, whatever its pieces' precision
            part = part if weight == 1.0 else part * weight
            loss_sum = part if loss_sum is None else loss_sum + part
        assert loss_sum is not None  # a step has at least one piece
        for ready in self.split.grads_ready:
            ready()
        # a non-finite loss or gradient (or a spike) never reaches the optimizer
        trial = self.trying  # a trial step is redone: no rollback point
        ok = self.diagnostics is None or self.diagnostics.check(step, loss_sum, lambda: self._rerun(pieces), trial)
        with label("fwk.optimizer"):
            if ok:
                self._step_optimizer()
            self.optimizer.zero_grad(set_to_none=True)
        return loss_sum

    def _step_optimizer(self) -> None:
        """Clip the true gradients, then step the optimizer. A strategy that steps it itself
        does so, as fp16's scaler does, and otherwise it steps plainly."""
        if self.grad_clip > 0:
            for unscale in self._unscale:
                unscale(self.optimizer)
            if self.split.norm_params is not None:
                split = self.split
                clip_grad_norm_(split.norm_params(), self.grad_clip, split.norm_across, split.uncounted())
            else:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        if not any(step(self.optimizer) for step in self._optimizer_step):
            self.optimizer.step()

    def _rerun(self, pieces: list[Batch]) -> None:
        """Run the step's forward and backward again on the unwrapped model, for diagnostics' hooks."""
        model = self.diagnostics.model  # type: ignore[union-attr]  # only diagnostics calls it
        for x, y in pieces:
            x, y = x.to(self.dist.device), y.to(self.dist.device)
            self._forward(model, x, y).backward()
