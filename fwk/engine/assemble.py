"""Everything a run has, built from its config and restored from its latest checkpoint.

``build_run(cfg, run_dir)`` returns a ``Run``: the process group, the data, the model with its
strategies applied, the optimizer and schedule, the methods and components, the step, the
loaders, and every part a checkpoint holds, at the step the run stands at. The loop
(``fwk.engine.trainer.train``) only runs it, and ``finish`` summarises it.

A caller that changes the model before training (``fwk export`` trains its pruned model,
``fwk profile`` labels every module) builds it with ``fresh_model`` and passes it in.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fwk.components.best import BestKeeper
from fwk.components.checkpoint import Checkpointer, RewindPoint
from fwk.components.diagnostics import Diagnostics
from fwk.components.metrics import Reporter
from fwk.components.reproduce import deterministic, record_decisions, record_launch
from fwk.components.resumable import Resumable
from fwk.components.sinks import Tracking
from fwk.components.train_state import set_rng_state
from fwk.components.trials import Replayable
from fwk.config.schema import Config
from fwk.config.target import Target, parse_target
from fwk.data import loader as loading
from fwk.data.base import DataBundle
from fwk.data.build import build_data, example_input
from fwk.data.loader_plan import LoaderPlan, for_run, measures
from fwk.data.prefetch import DevicePrefetcher, OnDevice
from fwk.distributed.collectives import broadcast_object
from fwk.distributed.group import Dist, init
from fwk.distributed.resize import derived_seed, written_batch_degree
from fwk.distributed.sharded import is_sharded
from fwk.distributed.shares import split
from fwk.engine.evaluate import EvalWeights, Validation
from fwk.engine.state import Clock, seed_everything
from fwk.engine.step import TrainStep
from fwk.methods.base import Methods
from fwk.models.build import build_model
from fwk.models.loss import CrossEntropy
from fwk.optim import build_optimizer, build_schedule, check_sharding, notes, state_floats_per_param
from fwk.optim.schedule_free import AveragedPoint
from fwk.strategies.decisions import Decisions
from fwk.strategies.parallelize import Strategies
from fwk.track import startup
from fwk.track.store import RunDir

logger = logging.getLogger(__name__)


@dataclass
class Progress:
    """This launch's counts, for the summary: what the loop adds up as it steps."""

    train_time: float = 0.0
    samples: int = 0
    data_wait: float = 0.0
    first_step_at: float | None = None  # this launch's first step, as a Unix time: the benchmarks' start-up figure
    final_eval: dict[str, float] = field(default_factory=dict)
    finished: bool = False  # reached its end (max_steps, its target, early stop); False: stopped by a signal


@dataclass
class Run:
    """One run in this process, built and restored. ``model`` is the plain model that the
    optimizer, evaluation and checkpoints use. ``trained`` is the one each step calls, compiled
    or DDP-wrapped."""

    cfg: Config
    dir: RunDir
    dist: Dist
    data: DataBundle
    reporter: Reporter
    decisions: Decisions
    strategies: Strategies
    methods: Methods
    model: nn.Module
    trained: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    diagnostics: Diagnostics
    step_fn: TrainStep
    loader: Replayable
    val: OnDevice
    checkpoints: Checkpointer
    rewind: RewindPoint
    best: BestKeeper
    averaged: AveragedPoint
    clock: Clock
    resumable: Resumable
    target: Target | None
    per_rank: int
    written: int | None  # the data-parallel degree that wrote its latest checkpoint, None for a new run
    undo_settings: Callable[[], None]  # puts back the process-wide settings the run changed
    started: float  # time.perf_counter() when build_run began: the summary's wall time
    step: int = 0
    resumed_from: Path | None = None
    progress: Progress = field(default_factory=Progress)

    def save(self) -> None:
        self.checkpoints.save(self.step, self.resumable.state_dict(self.step))

    @contextmanager
    def evaluated(self) -> Iterator[nn.Module]:
        """Give the weights the evaluation-weights sources give, else the trained ones, for one
        evaluation. ema gives its average, and schedule-free its averaged point."""
        with ExitStack() as stack:
            model = self.model
            sources: tuple[EvalWeights, ...] = (self.averaged, self.methods)
            for source in sources:
                model = stack.enter_context(source.evaluated(model))
            if self.strategies.pipeline is not None:  # through every stage, rank to rank
                model = self.strategies.pipeline.evaluated()
            yield model

    @property
    def validation(self) -> Validation:
        cfg = self.cfg
        return Validation(self.val, self.strategies.precision, self.data.task, self.dist, cfg.train.eval_batches)

    def validate(self) -> dict[str, float]:
        """Evaluate the weights ``evaluated`` gives, and return the metrics."""
        with self.evaluated() as model:
            return self.validation(model)

    def finish_methods(self) -> dict[str, Any]:
        """Let the methods act on the trained run (early_exit calibrates its threshold), and return
        their records for the summary. A method that keeps one changed its state: the final
        checkpoint is saved again with it."""
        with self.evaluated() as model:
            records = self.methods.finished(model, self.validation)
        if records:
            self.save()
        return records


def fresh_model(cfg: Config) -> nn.Module:
    """Build the config's model as ``build_run`` would, with the same seed, for a caller that
    changes it before training and passes it to ``build_run`` as ``model``."""
    seed_everything(cfg.seed)
    return build_model(cfg.model, build_data(cfg.data, seed=cfg.seed))


def loader_plan(cfg: Config, data: Any, per_rank: int, dist: Dist, decisions: Decisions) -> LoaderPlan:
    """Return loader=auto's plan. It is recalled from a replay or the cache where it would be
    measured, and decided otherwise. A measured plan is kept, and it is rank 0's, since the
    ranks of a node share its cores."""
    measured = measures(cfg.loader, data)
    record, source = decisions.recall("loader") if measured else (None, "")
    recalled = LoaderPlan(**record["plan"]) if record is not None else None
    plan = for_run(cfg.loader, data, per_rank, dist.device.type == "cuda", recalled, source)
    if measured and recalled is None:  # rank 0's, as a recalled plan is: a streamed set is split by the worker count
        plan = broadcast_object(plan, dist)  # type: ignore[assignment]
    if measured:
        decisions.keep(
            "loader", record or {"choice": plan.num_workers, "plan": dataclasses.asdict(plan)}, source or "measured"
        )
    return plan


def build_run(cfg: Config, run_dir: RunDir, tracking: Tracking | None = None, model: nn.Module | None = None) -> Run:
    """Build everything the run has, at the step its latest checkpoint holds, or at step 0 for
    a new run.

    ``tracking`` gets every logged row: it holds the worker's TensorBoard and MLflow sinks, and
    its caller closes it. ``model`` is the plain model to train instead of the config's freshly
    built one (``fresh_model``). It must be the same on every launch, so that a resumed run
    matches its checkpoint."""
    started = time.perf_counter()
    undo = deterministic(cfg.train.deterministic)
    try:
        return _build(cfg, run_dir, tracking, model, undo, started)
    except BaseException:
        undo()
        raise


def _build(
    cfg: Config,
    run_dir: RunDir,
    tracking: Tracking | None,
    model: nn.Module | None,
    undo: Callable[[], None],
    started: float,
) -> Run:
    dist = init(cfg.parallel.backend, cfg.train.device, cfg.parallel.collective_timeout_s, cfg.dims)
    if dist.device.type == "cuda":  # this run's peak, not an earlier run's in the same process
        torch.cuda.reset_peak_memory_stats(dist.device)
    seed_everything(cfg.seed)  # the same on every rank: identical initial weights
    data = _ended("data", build_data(cfg.data, seed=cfg.seed))
    # Another process count may resume (fwk/distributed/resize.py). Streamed data, whose order
    # follows the process count, then resumes at the start of its next epoch, and its loader says so.
    written = written_batch_degree(run_dir.checkpoints)
    cfg, per_rank, accum_factor = _batch_split(cfg, dist, written)
    reporter = Reporter(run_dir.metrics, dist, cfg.train.max_steps, tracking)
    decisions = Decisions(cfg, dist, orders=run_dir.read_orders())
    decisions.on_change = lambda records: record_decisions(run_dir, records)
    strategies = Strategies(cfg, dist, per_rank, decisions, accum_factor)
    methods = Methods(cfg.methods, cfg.method, cfg.train.max_steps)
    built = model if model is not None else build_model(cfg.model, data, init=written is None)
    model = _ended("model", built.to(dist.device))
    methods.prepare(model, data.task, example_input(data))
    model, trained = _ended("strategies", strategies.apply(model, state_floats_per_param(cfg.optim)))
    check_sharding(cfg.optim, is_sharded(model))
    optimizer, scheduler, diagnostics = _ended("optimizer", _optimizer(cfg, dist, model, strategies))

    def reshaped(steps_taken: int | None) -> None:  # a method replaced parameters: what holds them follows
        strategies.reshaped()
        diagnostics.reshaped(steps_taken)

    methods.attach(optimizer, model, reshaped)
    loss = methods.loss(CrossEntropy(fused=strategies.kernels.fused_loss))
    step_fn = TrainStep(
        trained, optimizer, strategies.per_step(), strategies.plan, loss, cfg.train.grad_clip, dist, diagnostics,
        strategies.split(),
    )  # fmt: skip
    loader, val, calibrated = _ended("loaders", _loaders(cfg, data, per_rank, dist, decisions))
    sharded = is_sharded(model)
    bn_batches = getattr(cfg.optim, "bn_batches", 0)  # optim=adamw_schedulefree's x, else inactive
    averaged = AveragedPoint(optimizer, model, calibrated, bn_batches, strategies.precision.autocast)
    best = BestKeeper(cfg.checkpoint, run_dir.path, dist, sharded)
    clock = Clock()  # training time over every launch: the time to target
    parts = dict(scheduler=scheduler, loader=loader, **strategies.parts(), diagnostics=diagnostics)
    parts.update(best=best, clock=clock, methods=methods, **({"eval_weights": averaged} if averaged.active else {}))
    run = Run(
        cfg=cfg,
        dir=run_dir,
        dist=dist,
        data=data,
        reporter=reporter,
        decisions=decisions,
        strategies=strategies,
        methods=methods,
        model=model,
        trained=trained,
        optimizer=optimizer,
        scheduler=scheduler,
        diagnostics=diagnostics,
        step_fn=step_fn,
        loader=loader,
        val=val,
        checkpoints=Checkpointer(run_dir.checkpoints, dist, cfg.checkpoint.keep, cfg.checkpoint.on_corrupt, sharded),
        rewind=RewindPoint(run_dir.path / "rewind", dist, cfg.checkpoint.rewind_at, cfg.train.max_steps),
        best=best,
        averaged=averaged,
        clock=clock,
        resumable=Resumable(model, optimizer, **parts),
        target=parse_target(cfg.train.stop_at) if cfg.train.stop_at else None,
        per_rank=per_rank,
        written=written,
        undo_settings=undo,
        started=started,
    )
    _restore(run)
    startup.mark("checkpoint")
    record_launch(run_dir, dist, data, cfg.seed, run.step, decisions.records())
    return run


def _ended(phase: str, value: Any) -> Any:
    """Mark the start-up phase ``phase`` as ended now, and return ``value``, which it built."""
    startup.mark(phase)
    return value


def _optimizer(cfg: Config, dist: Any, model: nn.Module, strategies: Strategies) -> tuple[Any, Any, Diagnostics]:
    """Build the optimizer, its schedule and the diagnostics that watch both, and say their notes."""
    optimizer = build_optimizer(
        cfg.optim, model, fused=strategies.kernels.triton, compute_dtype=strategies.precision.compute_dtype
    )
    for line in notes(cfg.optim, cfg.schedule, optimizer, model) if dist.is_main else ():
        logger.info(line)
    scheduler = build_schedule(cfg.schedule, optimizer, cfg.train.max_steps)
    diagnostics = Diagnostics(
        cfg.diagnostics, dist, model, optimizer, scheduler, strategies.precision, cfg.train.log_every
    )
    return optimizer, scheduler, diagnostics


def _batch_split(cfg: Config, dist: Any, written: int | None) -> tuple[Config, int, int]:
    """Return the config, the per-process batch and the accumulation factor for this world size.

    On fewer processes than wrote the checkpoint, each keeps its batch and accumulates more.
    """
    per_rank, accum_factor = split(cfg.train.batch_size, dist.batch_degree, written)
    if accum_factor > 1:
        cfg = dataclasses.replace(
            cfg, train=dataclasses.replace(cfg.train, accum_steps=cfg.train.accum_steps * accum_factor)
        )
    return cfg, per_rank, accum_factor


def _loaders(cfg: Config, data: Any, per_rank: int, dist: Any, decisions: Any) -> tuple[Any, Any, Any]:
    """Return the training batches, the validation batches and the calibration batches' source.

    The training batches are replayable: a trial's are handed out again when its steps are redone.
    """
    plan = loader_plan(cfg, data, per_rank, dist, decisions)
    loader = Replayable(
        loading.train_loader(data, per_rank, dist.batch_rank, dist.batch_degree, cfg.seed, plan, cfg.train.accum_steps)
    )
    val = OnDevice(
        loading.val_loader(data.val, per_rank, dist.batch_rank, dist.batch_degree, plan, data.collate),
        dist.device,
        data.finish,
    )
    calibration = loading.calibration_loader(data.train, per_rank, cfg.seed, plan, data.collate)
    return loader, val, lambda: DevicePrefetcher(calibration(), dist.device, data.finish)


def _restore(run: Run) -> None:
    """Restore the run at its latest checkpoint: model, optimizer, every part and the RNG
    streams. Seed it for its first step when there is none."""
    dist = run.dist
    found = run.checkpoints.load_latest(template=run.resumable.template)
    if found is None:
        seed_everything(run.cfg.seed + dist.rank)  # per-rank streams for dropout and the like
        if dist.is_main and (aside := run.dir.set_metrics_aside()):
            logger.info(aside)
        run.averaged.start()
        return
    latest, state, rng = found
    run.step, run.resumed_from = run.resumable.load_state_dict(state), latest
    if rng is not None:
        set_rng_state(rng)
    else:  # written on another world size: no RNG file for this rank
        seed_everything(derived_seed(run.cfg.seed, run.step, dist.rank))
    if dist.is_main and (dropped := run.dir.truncate_metrics(after_step=run.step)):
        logger.info(dropped)
    run.averaged.start()
