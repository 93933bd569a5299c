"""The training loop: build -> apply strategies -> restore -> step / log / eval / save.

The strategies are applied on top of plain single-device model code by
``fwk.strategies.parallelize`` (which owns their order). The loop itself only calls small
objects: one optimizer step (accumulation, micro-batches, loss scaling) is ``TrainStep``;
the strategies give their metrics, summary and checkpoint state as one; the DDP
communication monitor adapts between steps.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from fwk.components.best import BestKeeper
from fwk.components.checkpoint import Checkpointer, RewindPoint, set_rng_state
from fwk.components.diagnostics import Diagnostics
from fwk.components.metrics import Reporter, Window
from fwk.components.reproduce import make_deterministic, record_decisions, record_launch
from fwk.components.sinks import Tracking
from fwk.config.schema import Config
from fwk.config.target import parse_target
from fwk.data import loader as loading
from fwk.data.loader_plan import LoaderPlan, for_run, measures
from fwk.data.prefetch import DevicePrefetcher, OnDevice
from fwk.distributed.collectives import broadcast_object, replicas_in_sync
from fwk.distributed.group import init
from fwk.distributed.shares import split
from fwk.engine.build import build_data, build_model, example_input
from fwk.engine.evaluate import evaluate
from fwk.engine.resize import derived_seed, written_world_size
from fwk.engine.state import Clock, Resumable, StopSignal, seed_everything
from fwk.engine.step import TrainStep, label
from fwk.engine.trials import Replayable, Trials
from fwk.errors import UserError
from fwk.methods import Methods
from fwk.optim import build_optimizer, build_schedule, check_sharding, notes, state_floats_per_param
from fwk.optim.schedule_free import EvalWeights
from fwk.strategies.decisions import Decisions
from fwk.strategies.fsdp import is_sharded
from fwk.strategies.parallelize import Strategies
from fwk.track.store import RunDir

log = logging.getLogger("fwk")


def _as_built(model: torch.nn.Module) -> torch.nn.Module:
    return model


def _unobserved(step: int) -> None:
    pass


def loader_plan(
    cfg: Config, data: Any, per_rank: int, dist: Any, decisions: Decisions, say: Callable[[str], None]
) -> LoaderPlan:
    """loader=auto's plan: recalled (replay, cache) where it would be measured, else decided;
    a measured plan is kept (rank 0's: the ranks of a node share its cores)."""
    measured = measures(cfg.loader, data)
    record, source = decisions.recall("loader") if measured else (None, "")
    recalled = LoaderPlan(**record["plan"]) if record is not None else None
    plan = for_run(cfg.loader, data, per_rank, dist.device.type == "cuda", say, recalled, source)
    if measured and recalled is None:  # rank 0's, as a recalled plan is: a streamed set is split by the worker count
        plan = broadcast_object(plan, dist)  # type: ignore[assignment]
    if measured:
        decisions.keep(
            "loader", record or {"choice": plan.num_workers, "plan": dataclasses.asdict(plan)}, source or "measured"
        )
    return plan


def train(
    cfg: Config,
    run: RunDir,
    start: Callable[[torch.nn.Module], torch.nn.Module] = _as_built,
    observe: Callable[[int], None] = _unobserved,
    tracking: Tracking | None = None,
) -> dict[str, Any] | None:
    """Train to ``train.max_steps`` (or until stopped); returns the summary when finished.

    ``start`` turns the freshly built model into the one to train, before any strategy is
    applied: ``fwk export`` passes its pruned architecture with the weights it retrains
    from (lottery-ticket rounds, fine-tunes, quantization-aware training). It must give the
    same model every time it is called, so that a resumed run matches its checkpoint.
    ``observe(step)`` is called after every optimizer step (``fwk profile`` steps its
    profiler there). ``tracking`` gets every logged row (the worker's TensorBoard and MLflow
    sinks; its caller closes it); fwk export's retrains and fwk profile's runs pass none.
    """
    started = time.perf_counter()
    make_deterministic(cfg.train.deterministic)
    dist = init(cfg.parallel.backend, cfg.train.device, cfg.parallel.collective_timeout_s)
    if dist.device.type == "cuda":  # this run's peak, not an earlier train() in the same process
        torch.cuda.reset_peak_memory_stats(dist.device)
    seed_everything(cfg.seed)  # the same on every rank: identical initial weights
    data = build_data(cfg.data, seed=cfg.seed)
    written = written_world_size(run.checkpoints)  # another process count may resume (fwk/engine/resize.py)
    if written not in (None, dist.world_size) and data.train_loader is not None:
        raise UserError(
            f"run {run.id} was written by {written} processes and streamed data resumes on that many only "
            f"(this launch has {dist.world_size}); set parallel.nproc_per_node / nnodes to make {written}"
        )
    per_rank, accum_factor = split(cfg.train.batch_size, dist.world_size, written)
    if accum_factor > 1:  # fewer processes than wrote it: each keeps its batch, accumulated
        cfg = dataclasses.replace(
            cfg, train=dataclasses.replace(cfg.train, accum_steps=cfg.train.accum_steps * accum_factor)
        )
    reporter = Reporter(run.metrics, dist, cfg.train.max_steps, tracking)
    decisions = Decisions(cfg, dist)
    decisions.on_change = lambda records: record_decisions(run, records)
    strategies = Strategies(cfg, dist, per_rank, reporter.message, decisions)
    methods = Methods(cfg.methods, cfg.method, cfg.train.max_steps)
    plain = start(build_model(cfg.model, data, reporter.message)).to(dist.device)
    methods.prepare(plain, data.task, reporter.message if dist.is_main else lambda line: None, example_input(data))
    raw, model = strategies.apply(plain, state_floats_per_param(cfg.optim))
    check_sharding(cfg.optim, is_sharded(raw))
    optimizer = build_optimizer(
        cfg.optim, raw, fused=strategies.kernels.triton, compute_dtype=strategies.precision.compute_dtype
    )
    for line in notes(cfg.optim, cfg.schedule, optimizer, raw) if dist.is_main else ():
        reporter.message(line)
    scheduler = build_schedule(cfg.schedule, optimizer, cfg.train.max_steps)
    diagnostics = Diagnostics(
        cfg.diagnostics, dist, raw, optimizer, scheduler, strategies.precision, cfg.train.log_every, reporter.message
    )

    def reshaped(steps_taken: int | None) -> None:  # a method replaced parameters: what holds them follows
        strategies.reshaped()
        diagnostics.reshaped(steps_taken)

    methods.attach(optimizer, raw, reshaped)
    hooks = strategies.precision, strategies.memory, strategies.jit, strategies.kernels  # what a step calls
    smoothing = methods.label_smoothing(cfg.train.label_smoothing)
    train_cfg = dataclasses.replace(cfg.train, label_smoothing=smoothing)
    train_step = TrainStep(model, optimizer, *hooks, train_cfg, dist, diagnostics)
    plan = loader_plan(cfg, data, per_rank, dist, decisions, reporter.message)
    # the batches as the loop takes them: a trial's are handed out again when its steps are redone
    loader = Replayable(
        loading.train_loader(
            data, per_rank, dist.rank, dist.world_size, cfg.seed, plan, reporter.message, cfg.train.accum_steps
        )
    )
    val = OnDevice(
        loading.val_loader(data.val, per_rank, dist.rank, dist.world_size, plan, data.collate), dist.device, data.finish
    )
    ckpt = Checkpointer(run.checkpoints, dist, cfg.checkpoint.keep, cfg.checkpoint.on_corrupt, is_sharded(raw))
    rewind = RewindPoint(run.path / "rewind", dist, cfg.checkpoint.rewind_at, cfg.train.max_steps)
    best = BestKeeper(cfg.checkpoint, run.path, dist, is_sharded(raw))
    target = parse_target(cfg.train.stop_at) if cfg.train.stop_at else None
    calibration = loading.calibration_loader(data.train, per_rank, cfg.seed, plan, data.collate)
    bn_batches = getattr(cfg.optim, "bn_batches", 0)  # optim=adamw_schedulefree's x, else inactive
    calibrated = lambda: DevicePrefetcher(calibration(), dist.device, data.finish)  # noqa: E731
    averaged = EvalWeights(optimizer, raw, calibrated, bn_batches, strategies.precision.autocast)
    clock = Clock()  # training time over every launch: the time to target

    parts = dict(scheduler=scheduler, loader=loader, **strategies.parts(), diagnostics=diagnostics)
    parts.update(best=best, clock=clock, methods=methods, **({"eval_weights": averaged} if averaged.active else {}))
    resumable = Resumable(raw, optimizer, **parts)

    step = 0
    found = ckpt.load_latest(reporter.message, template=resumable.template)
    if found is not None:
        latest, state, rng = found
        step = resumable.load_state_dict(state)
        strategies.comm.accum_steps *= accum_factor  # the written run's (adapted) accumulation, on fewer processes
        if rng is not None:
            set_rng_state(rng)
        else:  # written on another world size: no RNG file for this rank
            seed_everything(derived_seed(cfg.seed, step, dist.rank))
        if dist.is_main and (dropped := run.truncate_metrics(after_step=step)):
            reporter.message(dropped)
    else:
        seed_everything(cfg.seed + dist.rank)  # per-rank streams for dropout and the like
    averaged.start()

    def save() -> None:
        ckpt.save(step, resumable.state_dict(step))

    def validate() -> dict[str, float]:  # the model a method evaluates (ema: the average), else the trained one
        with averaged.weights():  # schedule-free: at its averaged weights
            return evaluate(methods.eval_model(raw), val, strategies.precision, data.task, dist, cfg.train.eval_batches)

    record_launch(run, dist, data, cfg.seed, step, decisions.records())
    reporter.start(step)
    if found is not None:
        reporter.message(f"resumed run {run.id} from {latest.name} (step {step})")
        if written != dist.world_size:
            accum = strategies.comm.accum_steps
            reporter.message(
                f"resuming step {step} of run {run.id} on {dist.world_size} process{'es' * (dist.world_size > 1)} "
                f"(written by {written}): same global batch {per_rank * dist.world_size * accum}"
                + (f", as {accum} micro-batches" if accum > 1 else "")
            )
    stop = StopSignal()
    window = Window(dist.device)
    train_time, train_samples, data_wait, final_eval = 0.0, 0, 0.0, {}
    batches = DevicePrefetcher(loader, dist.device, data.finish)
    trials = Trials(train_step, resumable, loader, [window], reporter.message)
    model.train()
    first_step_at = None  # this launch's first step, as a Unix time: the benchmarks' start-up figure
    try:
        while step < cfg.train.max_steps and clock.reached is None:
            t0 = time.perf_counter()
            first_step_at = first_step_at or time.time()
            train_step.begin(step)
            trials.before(step)
            samples_per_step = cfg.train.batch_size * strategies.comm.accum_steps
            with label("fwk.data"):  # the data wait, for fwk profile's step split
                step_batches = [methods.batch(step, *next(batches)) for _ in range(strategies.comm.accum_steps)]
            t1 = time.perf_counter()
            loss = train_step(step, step_batches)
            methods.after_step(step, raw)
            scheduler.step()
            step += 1
            window.add(loss, t1 - t0)
            train_samples, data_wait = train_samples + samples_per_step, data_wait + t1 - t0
            train_time += time.perf_counter() - t0
            clock.seconds += time.perf_counter() - t0
            if trials.active:  # a trial step: redone once its decision is made, so nothing is kept of it
                redo = trials.after(step)
                step = step if redo is None else redo
                continue
            rewind.after(step, raw)
            observe(step)
            if step % cfg.train.log_every == 0 or step == cfg.train.max_steps:
                row = window.close(samples_per_step, dist)
                lr = scheduler.get_last_lr()[0]
                reporter.log(
                    step,
                    {
                        "loss": row.pop("loss"),
                        "lr": lr,
                        **row,
                        **strategies.metrics(step),
                        **diagnostics.metrics(),
                        "train_s": round(clock.seconds, 3),  # training seconds so far: fwk runs plot --x time
                    },
                )
                strategies.comm.adapt(step)
                if stop.agreed(dist):
                    save()
                    reporter.message(f"stopped at step {step}; checkpoint saved. Run the same command to resume.")
                    return None
            evaluating = cfg.train.eval_every and step % cfg.train.eval_every == 0
            ending = False
            if evaluating or step == cfg.train.max_steps:
                final_eval = validate()
                reporter.log(step, {**final_eval, "train_s": round(clock.seconds, 3)}, kind="eval")
                said = best.after_eval(step, final_eval, lambda at=step: resumable.state_dict(at))
                if said:
                    reporter.message(said)
                if target is not None and target.reached(final_eval):
                    clock.reached = {"step": step, "train_time_s": clock.seconds, "at": time.time()}
                    reporter.message(f"step {step}: {target} reached in {clock.seconds:.1f} s of training; stopping")
                    ending = True
                elif best.exhausted(cfg.train.early_stop_patience):
                    reporter.message(
                        f"step {step}: no better {best.metric} in {cfg.train.early_stop_patience} evaluations; "
                        "stopping (train.early_stop_patience)"
                    )
                    ending = True
            if ending or (cfg.checkpoint.every and step % cfg.checkpoint.every == 0) or step == cfg.train.max_steps:
                save()
            if ending:
                break
        if trials.abandon() is not None:  # the run ended inside a trial: its steps stand as they ran
            reporter.message(f"a decision's trial steps were still running at step {step}; they were not redone")
            save()
        if not final_eval:  # resumed from the final checkpoint: the loop had nothing left to do
            final_eval = validate()
    finally:
        stop.restore()
        reporter.close()
    return {
        "run_id": run.id,
        "status": "complete",
        "final_step": step,
        "eval": final_eval,
        "wall_time_s": time.perf_counter() - started,
        "first_step_at": first_step_at,
        "train_time_s": train_time,
        "samples_per_s": train_samples / max(train_time, 1e-9),
        "data_wait": min(1.0, data_wait / max(train_time, 1e-9)),  # share of train time spent waiting for data
        "world_size": dist.world_size,
        **peak_memory(dist.device),
        **strategies.summary(),
        **diagnostics.summary(),
        **(
            {"target": {"stop_at": str(target), "reached": clock.reached is not None, **(clock.reached or {})}}
            if target
            else {}
        ),
        **({"best": {"metric": best.metric, "value": best.saved}} if best.active else {}),
        "replicas_in_sync": replicas_in_sync(raw, dist),
    }


def peak_memory(device: torch.device) -> dict[str, float]:
    """The peak allocated device memory in GiB since the run began (CUDA; the CPU keeps no
    such count). memory=auto resets the counter around each trial step while it decides, so a
    run that decided late reports the peak since its last trial."""
    if device.type != "cuda":
        return {}
    return {"peak_memory_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 3)}
