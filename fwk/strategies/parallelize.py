"""The one place that applies the strategies to a model, in one fixed order.

Model code is plain single-device PyTorch. Everything that changes how it runs is applied
on top of it here, as torchtitan's ``parallelize_llama`` does, and the order is written
nowhere else:

1. ``kernels``: Triton LayerNorm/RMSNorm swapped in (same parameters), and the chunked head
   loss. It comes first, because the modules it swaps are what the next two match by pattern.
2. ``precision``: fp32 islands (``keep_fp32``), channels-last, the range probe.
3. ``pipeline``: the model cut into stages, this rank keeping its own (``pipeline.py``).
4. ``tensor``: each kept layer's matrices split over the ``tp`` ranks (``tensor.py``). It comes
   before checkpointing and compile, which wrap the modules it shards, as in torchtitan's order.
5. ``memory``: activation checkpointing, or offload, around the chosen blocks. It comes before
   compile, so that the compiled graph contains the checkpoints.
6. ``jit``: ``torch.compile``, or eager until ``auto`` decides. It goes around the plain model,
   so that evaluation and checkpoints keep using the plain one.
7. ``parallel``: data parallelism along the mesh's data dimension. DDP wraps the compiled
   model. FSDP shards the plain one in place, and the compiled wrapper then calls the sharded
   model. It comes last, because DDP and FSDP hook the parameters the others left in place,
   and the DDP communication monitor watches it.

Tensor and pipeline parallel need one device mesh (``fwk/distributed/mesh.py``), built once
here from the layout ``parallel.decide`` settles, and every technique takes its slice.

``Strategies`` builds each from its own config section, applies them (``apply``), and
hands the loop what it iterates over: their checkpoint state, metrics and summary.

The measured ones decide one at a time, in ``decisions.DECISION_ORDER``: precision (its range
probe and trial steps), then memory=auto, then jit=auto. Each decides on the result of those
before it, and none counts another's trial steps: ``TrainStep.begin`` tells each when it is
its turn, through ``PerStep.begin``. What they decide is recalled from, and kept in,
``Decisions``. The steps one tries candidates on are redone once it has decided
(``fwk/components/trials.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from torch import nn

from fwk.config.schema import Config
from fwk.distributed import mesh
from fwk.distributed.group import Dist
from fwk.strategies import parallel
from fwk.strategies.ddp import CommMonitor
from fwk.strategies.decisions import DECISION_ORDER, Decisions
from fwk.strategies.jit import Jit
from fwk.strategies.kernels import Kernels
from fwk.strategies.memory import Memory
from fwk.strategies.per_step import PerStep
from fwk.strategies.precision import Precision
from fwk.strategies.step_plan import Split, StepPlan

if TYPE_CHECKING:
    from fwk.strategies.pipeline import Pipeline

logger = logging.getLogger(__name__)

APPLY_ORDER = (
    "kernels",
    "precision",
    "pipeline",
    "tensor",
    "memory",
    "jit",
    "parallel",
)  # as ``apply`` runs them (tests check it)


class Strategies:
    """The strategy objects of one run. ``apply`` runs once, then the loop asks them per step."""

    def __init__(
        self,
        cfg: Config,
        dist: Dist,
        per_rank_batch: int,
        decisions: Decisions | None = None,
        accum_factor: int = 1,
    ) -> None:
        """Build each strategy from its own config section. ``accum_factor`` is how many times more
        each process accumulates than ``train.accum_steps`` says, and it is already in that key.
        It is above 1 in a run resumed by fewer processes."""
        if dist.layout.splits_model:  # what runs whole tensors, or retraces per rank, stays out
            cfg = _eager_and_plain(cfg, dist)
        self.cfg, self.dist = cfg, dist
        self.decisions = decisions if decisions is not None else Decisions(cfg, dist)
        d, steps, deterministic = self.decisions, cfg.train.max_steps, cfg.train.deterministic
        self.kernels = Kernels(cfg.kernels, dist.device)
        self.precision = Precision(cfg.precision, dist, steps, d, deterministic)
        self.memory = Memory(cfg.memory, dist, per_rank_batch, d, max_steps=steps)
        self.jit = Jit(cfg.jit, dist, steps, deterministic, d)
        self.plan = StepPlan(cfg.train.accum_steps, self.memory, accum_factor)
        self.comm: CommMonitor | None = None  # watches the wrapped model: made by apply()
        self.dims = dist.layout  # the layout: parallel=auto settles its data dimension in apply()
        self.pipeline: Pipeline | None = None
        self.grads_ready: list[Callable[[], None]] = []  # after a step's backward: the split layouts' syncs
        self.root_mesh: Any = None  # the device mesh, for the layouts that need one

    def apply(self, model: nn.Module, optimizer_floats: float) -> tuple[nn.Module, nn.Module]:
        """Apply the strategies in order, and return the plain model and the model to train.

        The plain model has kernels, islands and checkpoints installed, and it is what evaluation,
        checkpoints and the optimizer use. ``optimizer_floats`` is the optimizer state's elements
        per parameter, for parallel=auto's memory estimate."""
        assert self.comm is None, "strategies are applied once"
        cfg, dist = self.cfg, self.dist
        self.dims, facts = parallel.decide(cfg.parallel, dist, model, optimizer_floats)
        if dist.is_main and cfg.parallel.name == "auto" and dist.distributed:
            logger.info(f"parallel=auto chose {parallel.preset(self.dims)} ({self.dims.label()}): {facts}")
        root = mesh.build(self.dims, dist.device) if self.dims.shards or self.dims.splits_model else None
        model = self.kernels.apply(model)  # 1
        model = self.precision.prepare(model)  # 2
        if self.dims.pp > 1:  # 3
            from fwk.strategies import pipeline

            assert root is not None
            self.pipeline = pipeline.Pipeline(
                pipeline.split(model, cfg.parallel, self.dims, dist.rank), cfg.parallel, self.dims, root
            )
            model = self.pipeline.part
            self.grads_ready.append(self.pipeline.grads_ready)
        if self.dims.tp > 1:  # 4
            from fwk.strategies import tensor

            assert root is not None
            tensor.apply(model, root["tp"])
        model = self.memory.apply(model)  # 5
        compiled = self.jit.wrap(model)  # 6
        trained, syncs = parallel.wrap(compiled, model, cfg.parallel, dist, self.precision, self.dims, root)  # 7
        self.grads_ready += syncs
        self.root_mesh = root
        self.comm = CommMonitor(cfg.parallel, dist, self.plan, trained)
        self.model, self.trained = model, trained
        return model, trained

    def split(self) -> Split:
        """Return what the step does otherwise under this layout: nothing unless the model is split."""
        if not self.dims.splits_model:
            return Split()
        params = lambda: list(self.model.parameters())  # noqa: E731  (the DTensors' or this stage's)
        pipeline = self.pipeline
        if pipeline is None:
            return Split(grads_ready=self.grads_ready, norm_params=params)
        return Split(pipeline.piece, self.grads_ready, params, (pipeline.group,), pipeline.uncounted)

    def replica_group(self) -> Any:
        """Return the process group whose ranks should hold the same parameters: every rank, unless
        tensor or pipeline parallel split the model, and then its data-parallel peers."""
        if not self.dims.splits_model:
            return None
        assert self.root_mesh is not None
        return mesh.data_group(self.root_mesh, self.dims)

    def reshaped(self) -> None:
        """Follow a method, such as prune_gradually, that replaced the plain model's parameters.
        DDP's reducer holds the old ones and is built again, and memory's meter learns the new ones."""
        from fwk.strategies.ddp import Replicated

        for module in self.trained.modules():
            if isinstance(module, Replicated):
                module.rebuild()
        self.memory.reshaped(self.model)

    def per_step(self) -> list[PerStep]:
        """Return what a step calls (``PerStep``'s hooks), in the order they decide."""
        by_name: dict[str, PerStep] = {"precision": self.precision, "memory": self.memory, "jit": self.jit}
        return [by_name[name] for name in DECISION_ORDER]

    def parts(self) -> dict[str, Any]:
        """Return name -> strategy for every strategy whose state the checkpoint holds.

        Each has ``state_dict()``/``load_state_dict()``/``summary()``. The names are the checkpoint
        keys, also in checkpoints written before this file existed."""
        assert self.comm is not None, "apply() first"
        return {"precision": self.precision, "memory": self.memory, "jit": self.jit, "comm": self.comm}

    def metrics(self, step: int) -> dict[str, Any]:
        """Return the strategies' columns of a logged row. It closes the DDP monitor's window."""
        assert self.comm is not None, "apply() first"
        return {**self.precision.metrics(), **self.comm.window(step)}

    def summary(self) -> dict[str, Any]:
        """Return the strategies' summary entries, and the measured decisions, which ``fwk replay`` re-applies."""
        out = {k: v for part in self.parts().values() for k, v in part.summary().items()}
        return {**out, "decisions": self.decisions.records()}


def _eager_and_plain(cfg: Config, dist: Dist) -> Config:
    """Keep jit=auto eager and kernels=auto plain PyTorch under tensor or pipeline parallel, and
    say so in one line. validate refuses jit=compile and kernels=triton there."""
    jit = replace(cfg.jit, name="off") if cfg.jit.name == "auto" else cfg.jit
    kernels = replace(cfg.kernels, name="torch") if cfg.kernels.name == "auto" else cfg.kernels
    if dist.is_main and (jit is not cfg.jit or kernels is not cfg.kernels):
        logger.info(f"parallel {dist.layout.label()}: eager, plain PyTorch kernels (jit=auto and kernels=auto)")
    return replace(cfg, jit=jit, kernels=kernels)
