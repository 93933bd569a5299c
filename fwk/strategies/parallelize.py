"""The one place that applies the strategies to a model, in one fixed order.

Model code is plain single-device PyTorch; everything that changes how it runs is applied
on top of it here, as torchtitan's ``parallelize_llama`` does, and the order is written
nowhere else:

1. ``kernels``: Triton LayerNorm/RMSNorm swapped in (same parameters), the chunked head
   loss. First, because the modules it swaps are what the next two match by pattern.
2. ``precision``: fp32 islands (``keep_fp32``), channels-last, the range probe.
3. ``memory``: activation checkpointing (or offload) around the chosen blocks. Before
   compile, so that the compiled graph contains the checkpoints.
4. ``jit``: ``torch.compile`` (or eager until ``auto`` decides). Around the plain model,
   so that evaluation and checkpoints keep using the plain one.
5. ``parallel``: DDP wraps the compiled model; FSDP shards the plain one in place (the
   compiled wrapper then calls the sharded model). Last, because DDP and FSDP hook the
   parameters the others left in place, and the DDP communication monitor watches it.

``Strategies`` builds each from its own config section, applies them (``apply``), and
hands the loop what it iterates over: their checkpoint state, metrics and summary.

The measured ones decide one at a time, in ``decisions.DECISION_ORDER``: precision (its range probe
and trial steps), then memory=auto, then jit=auto; each decides on the result of those
before it, and none counts another's trial steps (``TrainStep.begin`` tells each when it is
its turn, through ``PerStep.begin``). What they decide is recalled from, and kept in, ``Decisions``; the steps one
tries candidates on are redone once it has decided (``fwk/engine/trials.py``).
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

from fwk.config.schema import Config
from fwk.distributed.group import Dist
from fwk.strategies import parallel
from fwk.strategies.ddp import CommMonitor
from fwk.strategies.decisions import DECISION_ORDER, Decisions
from fwk.strategies.jit import Jit
from fwk.strategies.kernels import Kernels
from fwk.strategies.memory import Memory
from fwk.strategies.per_step import PerStep
from fwk.strategies.precision import Precision
from fwk.strategies.step_plan import StepPlan

logger = logging.getLogger(__name__)

APPLY_ORDER = ("kernels", "precision", "memory", "jit", "parallel")  # as ``apply`` runs them (tests check it)


class Strategies:
    """The strategy objects of one run; ``apply`` once, then the loop asks them per step."""

    def __init__(
        self,
        cfg: Config,
        dist: Dist,
        per_rank_batch: int,
        decisions: Decisions | None = None,
        accum_factor: int = 1,
    ) -> None:
        """``accum_factor``: how many times more each process accumulates than
        ``train.accum_steps`` says (already in it): a run resumed by fewer processes."""
        self.cfg, self.dist = cfg, dist
        self.decisions = decisions if decisions is not None else Decisions(cfg, dist)
        d, steps, deterministic = self.decisions, cfg.train.max_steps, cfg.train.deterministic
        self.kernels = Kernels(cfg.kernels, dist.device)
        self.precision = Precision(cfg.precision, dist, steps, d, deterministic)
        self.memory = Memory(cfg.memory, dist, per_rank_batch, d, max_steps=steps)
        self.jit = Jit(cfg.jit, dist, steps, deterministic, d)
        self.plan = StepPlan(cfg.train.accum_steps, self.memory, accum_factor)
        self.comm: CommMonitor | None = None  # watches the wrapped model: made by apply()

    def apply(self, model: nn.Module, optimizer_floats: float) -> tuple[nn.Module, nn.Module]:
        """(plain model with kernels, islands and checkpoints installed; the model to train).

        ``optimizer_floats``: optimizer state elements per parameter (parallel=auto's memory
        estimate). The plain model is what evaluation, checkpoints and the optimizer use."""
        assert self.comm is None, "strategies are applied once"
        cfg, dist = self.cfg, self.dist
        model = self.kernels.apply(model)  # 1
        model = self.precision.prepare(model)  # 2
        model = self.memory.apply(model)  # 3
        compiled = self.jit.wrap(model)  # 4
        trained = parallel.wrap(compiled, model, cfg.parallel, dist, self.precision, optimizer_floats)  # 5
        self.comm = CommMonitor(cfg.parallel, dist, self.plan, trained)
        self.model, self.trained = model, trained
        return model, trained

    def reshaped(self) -> None:
        """After a method replaced the plain model's parameters (prune_gradually): DDP's
        reducer holds the old ones and is built again; memory's meter learns the new ones."""
        from fwk.strategies.ddp import Replicated

        for module in self.trained.modules():
            if isinstance(module, Replicated):
                module.rebuild()
        self.memory.reshaped(self.model)

    def per_step(self) -> list[PerStep]:
        """What a step calls (``PerStep``'s hooks), in the order they decide."""
        by_name: dict[str, PerStep] = {"precision": self.precision, "memory": self.memory, "jit": self.jit}
        return [by_name[name] for name in DECISION_ORDER]

    def parts(self) -> dict[str, Any]:
        """name -> strategy with ``state_dict()``/``load_state_dict()``/``summary()``: the
        checkpoint keys (their names in checkpoints written before this file existed too)."""
        assert self.comm is not None, "apply() first"
        return {"precision": self.precision, "memory": self.memory, "jit": self.jit, "comm": self.comm}

    def metrics(self, step: int) -> dict[str, Any]:
        """The strategies' columns of a logged row; closes the DDP monitor's window."""
        assert self.comm is not None, "apply() first"
        return {**self.precision.metrics(), **self.comm.window(step)}

    def summary(self) -> dict[str, Any]:
        """The strategies' summary entries, and the measured decisions (``fwk replay`` re-applies them)."""
        out = {k: v for part in self.parts().values() for k, v in part.summary().items()}
        return {**out, "decisions": self.decisions.records()}
