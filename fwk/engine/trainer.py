"""The training loop: build -> apply strategies -> restore -> step / log / eval / save.

Strategies are applied on top of plain single-device model code, in one fixed order
(torchtitan's habit): kernels (Triton modules) -> precision (fp32 islands, channels-last)
-> memory (activation checkpointing) -> compile (jit) -> data parallelism (DDP wraps,
FSDP shards in place). The loop itself only calls small objects; one optimizer step
(accumulation, micro-batches, loss scaling) is ``TrainStep``; the communication monitor
(``CommMonitor``) adapts DDP between steps.
"""

from __future__ import annotations

import logging
import random
import signal
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fwk.config.schema import Config
from fwk.data import loader as loading
from fwk.data.prefetch import DevicePrefetcher, OnDevice
from fwk.engine import parallel
from fwk.engine.build import build_data, build_model
from fwk.engine.checkpoint import Checkpointer, RewindPoint, set_rng_state
from fwk.engine.comm import CommMonitor
from fwk.engine.diagnostics import Diagnostics
from fwk.engine.evaluate import evaluate
from fwk.engine.jit import Jit
from fwk.engine.kernels import Kernels
from fwk.engine.memory import Memory
from fwk.engine.metrics import Reporter, Window
from fwk.engine.precision import Precision
from fwk.engine.reproduce import make_deterministic, record_launch
from fwk.engine.step import TrainStep, label
from fwk.engine.tracking import Tracking
from fwk.optim import build_optimizer, build_schedule, state_floats_per_param
from fwk.track.store import RunDir

log = logging.getLogger("fwk")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class StopSignal:
    """SIGTERM/SIGINT/SIGUSR1 ask the loop to save a checkpoint and stop at the next step boundary.

    SIGUSR1 is a batch system's preemption notice (scripts/slurm/train.sbatch). SLURM signals
    every process of a job step and fwk's launcher forwards it as well, so it may come twice:
    a repeat changes nothing. A second SIGINT/SIGTERM stops at once.
    """

    def __init__(self) -> None:
        self.requested = False
        signals = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
        self._previous = {s: signal.signal(s, self._handle) for s in signals}

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        if signum != signal.SIGUSR1:
            signal.signal(signum, self._previous[signum])  # a second Ctrl-C stops at once

    def agreed(self, d: parallel.Dist) -> bool:
        """True when any rank was asked to stop (a collective when distributed)."""
        return parallel.all_reduce_sum([float(self.requested)], d)[0] > 0

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


class Resumable:
    """What a checkpoint holds: the model and optimizer (whole, or this rank's shards) and
    the state of every object the loop calls, gathered from them and given back to them."""

    def __init__(self, raw: torch.nn.Module, optimizer: torch.optim.Optimizer, **parts: Any) -> None:
        self.raw, self.optimizer, self.parts = raw, optimizer, parts

    def template(self) -> dict[str, Any]:
        return parallel.model_state(self.raw, self.optimizer)

    def state_dict(self, step: int) -> dict[str, Any]:
        parts = {name: part.state_dict() for name, part in self.parts.items()}
        return {**parallel.model_state(self.raw, self.optimizer), **parts, "step": step}

    def load_state_dict(self, state: dict[str, Any]) -> int:
        """Restore everything; returns the step the checkpoint was taken at."""
        parallel.load_model_state(self.raw, self.optimizer, state)
        for name, part in self.parts.items():
            if name in state:  # a checkpoint from before a part existed leaves it as built
                part.load_state_dict(state[name])
        return int(state["step"])


def _as_built(model: torch.nn.Module) -> torch.nn.Module:
    return model


def _unobserved(step: int) -> None:
    pass


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
    d = parallel.init(cfg.parallel, cfg.train.device)
    seed_everything(cfg.seed)  # the same on every rank: identical initial weights
    data = build_data(cfg.data, seed=cfg.seed)
    per_rank = cfg.train.batch_size // d.world_size
    reporter = Reporter(run.metrics, d, cfg.train.max_steps, tracking)
    precision = Precision(cfg.precision, d, cfg.train.max_steps, reporter.message)
    memory = Memory(cfg.memory, d, per_rank, reporter.message)
    jit = Jit(cfg.jit, d, cfg.train.max_steps, reporter.message, cfg.train.deterministic)
    kernels = Kernels(cfg.kernels, d.device, reporter.message)
    raw = start(build_model(cfg.model, data)).to(d.device)
    raw = memory.apply(precision.prepare(kernels.apply(raw)))
    floats = state_floats_per_param(cfg.optim)
    model = parallel.wrap(jit.wrap(raw), raw, cfg.parallel, d, precision, floats, reporter.message)
    comm = CommMonitor(cfg.parallel, d, cfg.train.accum_steps, model, reporter.message)
    optimizer = build_optimizer(cfg.optim, raw, fused=kernels.triton)
    scheduler = build_schedule(cfg.schedule, optimizer, cfg.train.max_steps)
    diagnostics = Diagnostics(
        cfg.diagnostics, d, raw, optimizer, scheduler, precision, cfg.train.log_every, reporter.message
    )
    train_step = TrainStep(model, optimizer, precision, memory, jit, kernels, cfg.train, d, diagnostics)
    plan = loading.for_run(cfg.loader, data, per_rank, d.device.type == "cuda", reporter.message)
    loader = loading.TrainLoader(data.train, per_rank, d.rank, d.world_size, cfg.seed, plan, data.collate)
    val = OnDevice(
        loading.val_loader(data.val, per_rank, d.rank, d.world_size, plan, data.collate), d.device, data.finish
    )
    ckpt = Checkpointer(run.checkpoints, d, cfg.checkpoint.keep, cfg.checkpoint.on_corrupt, parallel.sharded(raw))
    rewind = RewindPoint(run.path / "rewind", d, cfg.checkpoint.rewind_at, cfg.train.max_steps)

    parts = dict(
        scheduler=scheduler,
        loader=loader,
        precision=precision,
        memory=memory,
        jit=jit,
        comm=comm,
        diagnostics=diagnostics,
    )
    resumable = Resumable(raw, optimizer, **parts)

    step = 0
    found = ckpt.load_latest(reporter.message, template=resumable.template)
    if found is not None:
        latest, state, rng = found
        step = resumable.load_state_dict(state)
        set_rng_state(rng)
        if d.is_main:
            run.truncate_metrics(after_step=step)
    else:
        seed_everything(cfg.seed + d.rank)  # per-rank streams for dropout and the like

    def save() -> None:
        ckpt.save(step, resumable.state_dict(step))

    record_launch(run, d, data, cfg.seed, step)
    reporter.start(step)
    if found is not None:
        reporter.message(f"resumed run {run.id} from {latest.name} (step {step})")
    stop = StopSignal()
    window = Window(d.device)
    train_time, train_samples, data_wait, final_eval = 0.0, 0, 0.0, {}
    batches = DevicePrefetcher(iter(loader), d.device, data.finish)
    model.train()
    try:
        while step < cfg.train.max_steps:
            t0 = time.perf_counter()
            samples_per_step = cfg.train.batch_size * comm.accum_steps
            with label("fwk.data"):  # the data wait, for fwk profile's step split
                step_batches = [next(batches) for _ in range(comm.accum_steps)]
            t1 = time.perf_counter()
            loss = train_step(step, step_batches)
            scheduler.step()
            step += 1
            rewind.after(step, raw)
            observe(step)
            window.add(loss, t1 - t0)
            train_samples, data_wait = train_samples + samples_per_step, data_wait + t1 - t0
            train_time += time.perf_counter() - t0
            if step % cfg.train.log_every == 0 or step == cfg.train.max_steps:
                row = window.close(samples_per_step, d)
                lr = scheduler.get_last_lr()[0]
                reporter.log(
                    step,
                    {
                        "loss": row.pop("loss"),
                        "lr": lr,
                        **row,
                        **precision.metrics(),
                        **comm.window(step),
                        **diagnostics.metrics(),
                    },
                )
                comm.adapt(step)
                if stop.agreed(d):
                    save()
                    reporter.message(f"stopped at step {step}; checkpoint saved. Run the same command to resume.")
                    return None
            evaluating = cfg.train.eval_every and step % cfg.train.eval_every == 0
            if evaluating or step == cfg.train.max_steps:
                final_eval = evaluate(raw, val, precision, data.task, d, cfg.train.eval_batches)
                reporter.log(step, final_eval, kind="eval")
            if (cfg.checkpoint.every and step % cfg.checkpoint.every == 0) or step == cfg.train.max_steps:
                save()
        if not final_eval:  # resumed from the final checkpoint: the loop had nothing left to do
            final_eval = evaluate(raw, val, precision, data.task, d, cfg.train.eval_batches)
    finally:
        stop.restore()
        reporter.close()
    return {
        "run_id": run.id,
        "status": "complete",
        "final_step": step,
        "eval": final_eval,
        "wall_time_s": time.perf_counter() - started,
        "train_time_s": train_time,
        "samples_per_s": train_samples / max(train_time, 1e-9),
        "data_wait": min(1.0, data_wait / max(train_time, 1e-9)),  # share of train time spent waiting for data
        "world_size": d.world_size,
        **precision.summary(),
        **memory.summary(),
        **jit.summary(),
        **comm.summary(),
        **diagnostics.summary(),
        "replicas_in_sync": parallel.replicas_in_sync(raw, d),
    }
