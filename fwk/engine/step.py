"""One optimizer step: gradient accumulation, micro-batches, precision, OOM retry.

A step consumes ``train.accum_steps`` loader batches; the memory plan may split each into
micro-batches. Each piece's loss is weighted by its share of the step's targets, so the
summed gradient is the gradient of the mean loss over the whole step, as one big batch
would give. DDP all-reduces gradients only on the last piece (``no_sync`` before).

The parts of a step are labelled for ``torch.profiler`` (``fwk.data``: the copy to the
device, ``fwk.forward``, ``fwk.backward``, ``fwk.optimizer``): ``fwk profile`` splits the
step by them. A label is only opened while a profiler records (half a microsecond to ask).
"""

from __future__ import annotations

import contextlib
import time

import torch
from torch import nn
from torch.profiler import record_function

from fwk.components.diagnostics import Diagnostics
from fwk.config.schema import TrainConfig
from fwk.distributed.group import Dist
from fwk.strategies.jit import Jit
from fwk.strategies.kernels import Kernels
from fwk.strategies.memory import Memory
from fwk.strategies.precision import Precision

Batch = tuple[torch.Tensor, torch.Tensor]


def label(name: str) -> contextlib.AbstractContextManager:
    """A ``record_function`` range while a profiler records, else nothing (a range costs
    several microseconds even with no profiler: too much for a fast GPU step, four times)."""
    return record_function(name) if torch._C._autograd._profiler_enabled() else contextlib.nullcontext()


class TrainStep:
    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        precision: Precision,
        memory: Memory,
        jit: Jit,
        kernels: Kernels,
        cfg: TrainConfig,
        dist: Dist,
        diagnostics: Diagnostics | None = None,
        label_smoothing: float = 0.0,
    ) -> None:
        self.model, self.optimizer, self.precision, self.memory, self.jit = model, optimizer, precision, memory, jit
        self.kernels, self.cfg, self.dist, self.diagnostics = kernels, cfg, dist, diagnostics
        self.label_smoothing = label_smoothing  # methods=[label_smoothing]
        self._begun: int | None = None
        self._settled = False

    def begin(self, step: int) -> None:
        """Before the step: each strategy's setting for it, and whose turn it is to decide. The
        loop calls it before drawing the step's batches (a trial's snapshot is taken then);
        the step calls it itself when not."""
        self.precision.begin(step)
        self.memory.begin(step, turn=self.precision.decided)
        # one decision at a time: precision, then memory, then jit; none counts another's trial steps
        self._settled = self.precision.decided and not self.memory.measuring
        self._begun = step

    @property
    def trying(self) -> bool:
        """Whether this step is a trial step: it runs a candidate a decision is timing, which a
        run that recalled the decision would not run (``fwk/engine/trials.py`` redoes it)."""
        return self.precision.trying or self.memory.trying or self.jit.trying

    def __call__(self, step: int, batches: list[Batch]) -> torch.Tensor:
        """Run the step; returns the detached mean loss. An OOM, or a failed compilation, redoes
        it with the same data."""
        if self._begun != step:
            self.begin(step)
        self._begun = None
        settled = self._settled
        while True:
            t0 = time.perf_counter()
            out_of_memory = False
            try:
                with self.memory.measure():
                    loss = self._run(step, batches)
            except torch.cuda.OutOfMemoryError:  # also raised by CPU tests that simulate it
                out_of_memory = True
            except Exception as exc:
                if not self.jit.recover(exc):
                    raise
                self.optimizer.zero_grad(set_to_none=True)
                continue
            if out_of_memory:
                # out here, not in the except block: its traceback's frames hold the failed
                # step's activations, which the redo needs freed
                self.optimizer.zero_grad(set_to_none=True)
                self.memory.retry_after_oom(step)
                continue
            if (self.jit.timing or self.precision.timing) and self.dist.device.type == "cuda":
                torch.cuda.synchronize(self.dist.device)  # only while a decision is timing steps
            seconds = time.perf_counter() - t0
            self.precision.step_done(step, seconds)
            self.jit.step_done(step, seconds, settled)
            return loss

    def _run(self, step: int, batches: list[Batch]) -> torch.Tensor:
        device = self.dist.device
        pieces = [p for x, y in batches for p in self.memory.split(x, y)]
        total = sum(y.numel() for _, y in pieces)
        loss_sum = torch.zeros((), device=device)
        for i, (x, y) in enumerate(pieces):
            weight = y.numel() / total
            last = i == len(pieces) - 1
            no_sync = getattr(self.model, "no_sync", None)
            with contextlib.nullcontext() if last or no_sync is None else no_sync(), self.memory.saved_tensors():
                with label("fwk.data"):
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                with label("fwk.forward"), self.precision.autocast():
                    loss = self.kernels.loss(self.model, self.precision.input(x), y, self.label_smoothing)
                with label("fwk.backward"):
                    self.precision.backward(loss if weight == 1.0 else loss * weight)
            loss_sum += loss.detach() * weight
        # a non-finite loss or gradient (or a spike) never reaches the optimizer
        trial = self.trying  # a trial step is redone: no rollback point
        ok = self.diagnostics is None or self.diagnostics.check(step, loss_sum, lambda: self._rerun(pieces), trial)
        with label("fwk.optimizer"):
            if ok:
                self.precision.step(self.optimizer, self.model.parameters(), self.cfg.grad_clip)
            self.optimizer.zero_grad(set_to_none=True)
        return loss_sum

    def _rerun(self, pieces: list[Batch]) -> None:
        """The step's forward and backward again, on the unwrapped model, for diagnostics' hooks."""
        raw = self.diagnostics.raw  # type: ignore[union-attr]  # only diagnostics calls it
        for x, y in pieces:
            x, y = x.to(self.dist.device), y.to(self.dist.device)
            with self.precision.autocast():
                loss = self.kernels.loss(raw, self.precision.input(x), y, self.label_smoothing)
            loss.backward()
