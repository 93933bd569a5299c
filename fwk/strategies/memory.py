"""Memory strategies: config group ``memory`` (read here and nowhere else).

- ``none``: autograd keeps every activation until backward.
- ``checkpoint``: non-reentrant activation checkpointing of every ``every``-th block
  (ResNet bottlenecks, GPT blocks, or the module names in ``modules``), recomputed in
  backward. Gradients are bit-identical to ``none``.
- ``offload``: saved activations leave the training device during forward and come back
  one ahead of backward's need (``offload.py``): to pinned host memory on CUDA, to a spill
  file on CPU. Gradients are bit-identical to ``none``.
- ``microbatch``: each rank's batch is split into ``micro_batches`` pieces whose
  gradients are accumulated (see ``step.py``). DDP syncs only on the last.
- ``auto``: on CUDA, or on CPU when ``budget_gb`` is set, once precision has decided, the
  next steps are run under each candidate plan (none, microbatch x2, checkpoint, offload)
  and measured: on CUDA the allocator's peak, on CPU the activations a step holds (saved
  tensors, and what offload held at once of those it moved). The fastest plan that fits
  the budget is kept, and an out-of-memory step is redone with twice the micro-batches. The
  choice is cached per machine and model (``decisions.py``). A later run, or a replay,
  switches to it when its turn comes, without trials. A measuring run does the same: the
  loop redoes the trial steps under the chosen plan (``fwk/components/trials.py``).

A strategy is a ``MemoryPlan``. The checkpoint wrappers are installed once and switched on
and off by the plan, so ``auto`` can move between plans without rebuilding the model.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from fwk.config.asks import MODULES
from fwk.config.schema import MemoryConfig
from fwk.distributed.collectives import all_reduce_max
from fwk.distributed.group import Dist
from fwk.errors import UserError
from fwk.strategies.decisions import Decisions
from fwk.strategies.modules import blocks, fitting, match, outermost, wrap_forward
from fwk.strategies.offload import Offload
from fwk.strategies.per_step import PerStep
from fwk.strategies.saved_tensors import SavedTensorMeter

logger = logging.getLogger(__name__)

GB = 1e9


@dataclass(frozen=True)
class MemoryPlan:
    checkpoint: bool = False
    offload: bool = False
    micro_batches: int = 1

    def describe(self) -> str:
        parts = (["checkpoint"] if self.checkpoint else []) + (["offload"] if self.offload else [])
        if self.micro_batches > 1:
            parts.append(f"microbatch x{self.micro_batches}")
        return " + ".join(parts) or "none"


@contextlib.contextmanager
def _keep_norm_stats(module: nn.Module) -> Iterator[None]:
    """Keep BatchNorm running stats around a recomputation, so that they are updated once, in
    the forward pass, not again when backward recomputes the block."""
    norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training]
    saved = [{k: b.clone() for k, b in m.named_buffers(recurse=False) if b is not None} for m in norms]
    try:
        yield
    finally:
        with torch.no_grad():
            for m, buffers in zip(norms, saved, strict=False):
                for k, value in buffers.items():
                    getattr(m, k).copy_(value)


def _checkpointed(module: nn.Module, plan: Callable[[], MemoryPlan], meter: SavedTensorMeter):
    def contexts() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
        return contextlib.nullcontext(), _keep_norm_stats(module)

    def wrapper(forward: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            if not plan().checkpoint or not torch.is_grad_enabled():
                return forward(*args, **kwargs)
            for a in args:
                meter.hold(a)  # kept alive by the checkpoint for its recomputation
            return checkpoint(forward, *args, use_reentrant=False, context_fn=contexts, **kwargs)

        return run

    return wrapper


def checkpoint_targets(model: nn.Module, cfg: MemoryConfig, patterns: list[str]) -> dict[str, nn.Module]:
    """Return the modules to checkpoint: every ``every``-th of those ``patterns`` name, else of the model's blocks."""
    found = outermost(match(model, patterns, "memory.modules")) if patterns else dict(blocks(model))
    return {n: m for i, (n, m) in enumerate(found.items()) if i % cfg.every == 0}


def _tried(plan: MemoryPlan, peak: float, seconds: float, budget: float) -> str:
    """Describe one trial as the memory=auto decision reports it."""
    if math.isinf(peak):
        return f"{plan.describe()} out of memory"
    return f"{plan.describe()} {peak / GB:.3g} GB {seconds * 1000:.0f} ms{'' if peak <= budget else ' (over)'}"


def check_model(cfg: MemoryConfig, model: nn.Module, typed: Collection[str] = ()) -> None:
    """Check before any work that the ``modules`` patterns the user typed match. A UserError names
    the closest names if not. A recipe's default patterns apply where they match (``modules.fitting``)."""
    if cfg.name in MODULES and "memory.modules" in typed:
        checkpoint_targets(model, cfg, cfg.modules)


class Memory(PerStep):
    def __init__(
        self,
        cfg: MemoryConfig,
        dist: Dist,
        per_rank_batch: int,
        decisions: Decisions | None = None,
        max_steps: int | None = None,
    ) -> None:
        """Set up the memory strategy. ``max_steps`` is the run's length: auto times no plans the run would end amid."""
        self.cfg, self.dist, self.per_rank_batch, self.decisions = cfg, dist, per_rank_batch, decisions
        self.max_steps = max_steps
        self.step = 0
        self._turn = False  # auto measures only once the decisions before it are made
        self._recalled = False
        self.timeline: list[tuple[int, MemoryPlan]] = []  # (step, plan) of each measured step
        self.meter = SavedTensorMeter(dist.device)
        self._warmed = False
        self.plan = {
            "checkpoint": MemoryPlan(checkpoint=True),
            "offload": MemoryPlan(offload=True),
            "microbatch": MemoryPlan(micro_batches=cfg.micro_batches),
        }.get(cfg.name, MemoryPlan())
        cuda = dist.device.type == "cuda"
        self.budget = cfg.budget_gb * GB
        if cfg.name == "auto" and cuda and not self.budget:
            free, _ = torch.cuda.mem_get_info(dist.device)
            self.budget = free + torch.cuda.memory_reserved(dist.device)  # what this process holds is ours too
        # auto's trials, plan -> (peak bytes, seconds). None once decided, or when it never decides
        self.trials: dict[MemoryPlan, tuple[float, float]] | None = {} if cfg.name == "auto" and self.budget else None
        plans = [MemoryPlan(), MemoryPlan(micro_batches=2), MemoryPlan(checkpoint=True), MemoryPlan(offload=True)]
        self.candidates = plans
        if cfg.name == "auto" and not self.budget and dist.is_main:
            logger.info("memory=auto chose none: on CPU a budget is needed to decide (set memory.budget_gb)")
        self.targets: list[str] = []
        self.offloaded: Offload | None = None  # the last piece's offload, for its counts

    def apply(self, model: nn.Module) -> nn.Module:
        """Install the switchable checkpoint wrappers on the plain model."""
        self.meter.leave_out(model)
        if self.cfg.name in ("checkpoint", "auto"):
            patterns, left_out = fitting(model, self.cfg.modules, "memory.modules")
            if left_out and self.dist.is_main:
                logger.info(left_out)
            targets = checkpoint_targets(model, self.cfg, patterns)
            for module in targets.values():
                wrap_forward(module, _checkpointed(module, lambda: self.plan, self.meter))
            self.targets = list(targets)
        if self.dist.is_main and self.cfg.name != "auto":
            where = f" of {len(self.targets)} modules ({self._target_text()})" if self.targets else ""
            logger.info(f"memory={self.plan.describe()}{where}")
        return model

    def reshaped(self, model: nn.Module) -> None:
        """Leave the new parameters out of the meter after a method (prune_gradually) replaced the plain model's."""
        self.meter.leave_out(model)

    def _target_text(self) -> str:
        shown = self.targets[:3] + (["..."] if len(self.targets) > 3 else [])
        return ", ".join(shown)

    # ---- per step -----------------------------------------------------------------
    def begin(self, step: int, turn: bool = True) -> bool:
        """Start a step. ``turn`` says that the decisions before memory's, precision's, are made,
        so auto may recall its decision or time this step. Return whether the next may decide:
        only once memory has."""
        self.step, self._turn = step, turn
        if turn and self.trials is not None and not self._recalled:
            self._recalled = True
            self._recall()
            self._too_short(step)
        return turn and not self.measuring

    def _too_short(self, step: int) -> None:
        """Keep the plain plan untimed in a run that would end amid auto's trial steps, a warm-up
        and then one per plan. A trial step is redone, and a run that ends in its trials logs
        none of its steps."""
        needed = 1 + len(self.candidates)
        if self.trials is None or self.max_steps is None or step + needed <= self.max_steps:
            return
        self.trials = None
        if self.dist.is_main:
            logger.info(
                f"memory=auto chose {self.plan.describe()}: the {self.max_steps - step} step(s) left are too few "
                f"to time its {len(self.candidates)} plans ({needed} steps)"
            )

    def _recall(self) -> None:
        record, source = self.decisions.recall("memory") if self.decisions is not None else (None, "")
        if record is None:
            return
        self.trials, self.plan = None, MemoryPlan(**record["plan"])
        self.decisions.keep("memory", {**record, "timeline": []}, source)  # type: ignore[union-attr]
        if self.dist.is_main:
            how = (
                "re-applied from the replayed run"
                if source == "replayed"
                else "as measured before for this model on this machine; auto.cache=false or --redecide measures again"
            )
            logger.info(f"memory=auto chose {self.plan.describe()} ({how})")

    def around_piece(self) -> contextlib.AbstractContextManager:
        """Return what wraps forward and backward of one micro-batch: offload, or the meter while auto measures."""
        if self.plan.offload:
            return self._offloading()
        return self.meter.counting(None) if self.measuring else contextlib.nullcontext()

    @contextlib.contextmanager
    def _offloading(self) -> Iterator[None]:
        """Offload the piece's saved activations (``offload.py``), counted while auto measures."""
        off = Offload(self.dist.device, self.meter.ignore, self.cfg.offload_ahead, self.cfg.offload_dir)
        hooks = torch.autograd.graph.saved_tensors_hooks(off.pack, off.unpack)
        try:
            with self.meter.counting(hooks, lambda: off.resident_peak) if self.measuring else hooks:
                yield
        finally:
            off.close()
            self.offloaded = off

    @property
    def measuring(self) -> bool:
        return self.trials is not None

    @property
    def trying(self) -> bool:
        """Tell whether this step runs a trial plan, now that its turn has come. The loop redoes it."""
        return self.measuring and self._turn

    def rewind(self, before: dict[str, Any]) -> None:
        """Prepare to redo the steps since ``before``, this object's state then. Once memory has
        decided, they run under the chosen plan. Otherwise, in another decision's trial, they run
        under the plan of then."""
        if self.trials is not None:
            self.plan = MemoryPlan(**before["plan"])

    @contextlib.contextmanager
    def around_step(self) -> Iterator[None]:
        """Time one whole step and record its peak memory while auto decides, in its turn."""
        if not self.measuring or not self._turn:
            yield
            return
        cuda = self.dist.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.dist.device)
            torch.cuda.reset_peak_memory_stats(self.dist.device)
        self.meter.take()
        t0 = time.perf_counter()
        yield
        if cuda:
            torch.cuda.synchronize(self.dist.device)
        seconds = time.perf_counter() - t0
        # on CPU the budget bounds activation memory: the largest micro-batch's saved tensors
        peak = torch.cuda.max_memory_allocated(self.dist.device) if cuda else self.meter.take()
        self._record(float(peak), seconds)

    def _record(self, peak: float, seconds: float) -> None:
        assert self.trials is not None
        peak, seconds = all_reduce_max([peak, seconds], self.dist)
        self.timeline.append((self.step, self.plan))
        if not self._warmed:  # the first step pays one-time costs (allocator, kernels): none runs again
            self._warmed = True
        else:
            self.trials[self.plan] = (peak, seconds)
        self._next_plan()

    def _next_plan(self) -> None:
        assert self.trials is not None
        left = [c for c in self.candidates if c not in self.trials]
        if left:
            self.plan = left[0]
            return
        fits = {p: t for p, t in self.trials.items() if t[0] <= self.budget}
        if not fits:  # nothing fits: checkpoint with ever more micro-batches
            # the least memory. Among plans that ran out of it, the one of the most micro-batches
            smallest = min(self.trials, key=lambda p: (self.trials[p][0], -p.micro_batches))
            more = replace(smallest, checkpoint=True, micro_batches=smallest.micro_batches * 2)
            while more in self.trials:  # never a plan tried already: each round halves the micro-batch
                more = replace(more, micro_batches=more.micro_batches * 2)
            if more.micro_batches > self.per_rank_batch:
                if math.isinf(self.trials[smallest][0]):
                    raise UserError(
                        f"out of memory at step {self.step} with every plan memory=auto tried, down to "
                        f"{smallest.describe()}; lower train.batch_size, use a smaller model, or more processes"
                    )
                raise UserError(
                    f"memory.budget_gb={self.budget / GB:.2f} is too small: the smallest plan "
                    f"({smallest.describe()}) peaks at {self.trials[smallest][0] / GB:.2f} GB; "
                    "raise memory.budget_gb or lower train.batch_size"
                )
            self.candidates.append(more)
            self.plan = more
            return
        self.plan = min(fits, key=lambda p: fits[p][1])
        if self.dist.is_main:
            tried = "; ".join(_tried(p, *t, self.budget) for p, t in self.trials.items())
            logger.info(
                f"memory=auto chose {self.plan.describe()}: fastest within {self.budget / GB:.3g} GB "
                f"({'peak' if self.dist.device.type == 'cuda' else 'activations'}; tried {tried})"
            )
        if self.decisions is not None:
            self.decisions.keep("memory", self._decision_record(), "measured")
        self.trials = None

    def _decision_record(self, trials: dict[MemoryPlan, tuple[float, float]] | None = None) -> dict[str, Any]:
        return {
            "choice": self.plan.describe(),
            "plan": asdict(self.plan),
            "budget_gb": self.budget / GB,
            "trials": [[p.describe(), peak, s] for p, (peak, s) in (trials or self.trials or {}).items()],
            "timeline": [[step, asdict(plan)] for step, plan in self.timeline],
        }

    def retry_after_oom(self, step: int) -> None:
        """Free memory after an out-of-memory step, then double the micro-batches under auto, or raise."""
        gc.collect()
        if self.dist.device.type == "cuda":
            torch.cuda.empty_cache()
        if self.dist.distributed and self.cfg.name == "auto":
            # the other ranks may be waiting in a gradient all-reduce this rank will not join:
            # redoing the step alone would pair mismatched collectives, so stop instead
            raise UserError(
                f"out of memory at step {step} on rank {self.dist.rank}; with several processes a step cannot be "
                f"redone on one rank alone: set memory=microbatch memory.micro_batches={self.plan.micro_batches * 2} "
                "or memory.budget_gb lower than the free memory, then run the same command to resume"
            )
        if self.cfg.name != "auto":
            raise UserError(
                f"out of memory at step {step} with memory={self.cfg.name}; use memory=auto (redoes the step "
                "with more micro-batches), memory=checkpoint, or a smaller train.batch_size"
            )
        if self.trials is not None:  # a trial plan that does not fit: record it as such
            self.trials[self.plan] = (float("inf"), float("inf"))
            self._next_plan()
            return
        doubled = replace(self.plan, micro_batches=self.plan.micro_batches * 2)
        if doubled.micro_batches > self.per_rank_batch:
            raise UserError(
                f"out of memory at step {step} even with one sample per micro-batch; lower train.batch_size, "
                "use a smaller model, or more processes"
            )
        if self.dist.is_main:
            logger.info(f"step {step}: out of memory; redoing the step with {doubled.describe()}")
        self.plan = doubled

    # ---- reporting and checkpoint state ------------------------------------------
    def summary(self) -> dict[str, Any]:
        return {"memory": self.plan.describe()}

    def state_dict(self) -> dict[str, Any]:
        return {"plan": asdict(self.plan), "deciding": self.trials is not None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state["deciding"]:  # decided before the checkpoint: that decision holds
            self.plan, self.trials = MemoryPlan(**state["plan"]), None
            if self.decisions is not None and self.cfg.name == "auto":
                self.decisions.keep("memory", self._decision_record({}), "checkpoint")
