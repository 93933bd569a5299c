"""The training loop, from a built run to its summary.

``train(run)`` steps a built run (``fwk.engine.assemble.build_run``) to its end, logging,
evaluating and saving as its config asks, and ``finish(run)`` writes its summary.

One optimizer step, with accumulation, micro-batches and loss scaling, is ``TrainStep``. The
strategies give their metrics, summary and checkpoint state as one, and the DDP communication
monitor adapts between steps. ``steps(run)`` is the loop itself, one optimizer step per item,
and ``fwk profile`` ends a profiler step after each.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import torch

from fwk.components.metrics import Window
from fwk.components.trials import Trials
from fwk.data.prefetch import DevicePrefetcher
from fwk.distributed.collectives import all_reduce_max, replicas_in_sync
from fwk.distributed.group import Dist
from fwk.engine.assemble import Run
from fwk.engine.state import StopSignal
from fwk.engine.step import label
from fwk.track import startup

logger = logging.getLogger(__name__)


def train(run: Run) -> dict[str, Any] | None:
    """Train until ``train.max_steps``, the run's target or an early stop, and return the
    summary it writes. Return None when a signal stopped the run. Its checkpoint is saved then."""
    for _ in steps(run):
        pass
    return finish(run) if run.progress.finished else None


def steps(run: Run) -> Iterator[int]:
    """Run the loop, and yield the step count after each optimizer step the run keeps. A
    trial's steps are redone, and not yielded."""
    cfg, dist, strategies, p = run.cfg, run.dist, run.strategies, run.progress
    _start(run)
    stop, window = StopSignal(), Window(dist.device)
    batches = DevicePrefetcher(run.loader, dist.device, run.data.finish)
    trials = Trials(run.step_fn, run.resumable, run.loader, [window])
    run.trained.train()
    try:
        while run.step < cfg.train.max_steps and run.clock.reached is None:
            t0 = time.perf_counter()
            p.first_step_at = p.first_step_at or startup.first_step()
            run.step_fn.begin(run.step)
            trials.before(run.step)
            samples_per_step = cfg.train.batch_size * strategies.plan.accum_steps
            with label("fwk.data"):  # the data wait, for fwk profile's step split
                step_batches = [run.methods.batch(run.step, *next(batches)) for _ in range(strategies.plan.accum_steps)]
            t1 = time.perf_counter()
            loss = run.step_fn(run.step, step_batches)
            run.methods.after_step(run.step, run.model)
            run.scheduler.step()
            run.step += 1
            window.add(loss, t1 - t0)
            p.samples, p.data_wait = p.samples + samples_per_step, p.data_wait + t1 - t0
            p.train_time += time.perf_counter() - t0
            run.clock.seconds += time.perf_counter() - t0
            if trials.active:  # a trial step: redone once its decision is made, so nothing is kept of it
                redo = trials.after(run.step)
                run.step = run.step if redo is None else redo
                continue
            run.rewind.after(run.step, run.model)
            yield run.step
            if run.step % cfg.train.log_every == 0 or run.step == cfg.train.max_steps:
                _log(run, window, samples_per_step)
                if stop.agreed(dist):
                    run.save()
                    logger.info(f"stopped at step {run.step}; checkpoint saved. Run the same command to resume.")
                    return
            evaluating = cfg.train.eval_every and run.step % cfg.train.eval_every == 0
            ending = _evaluate(run) if evaluating or run.step == cfg.train.max_steps else False
            every = cfg.checkpoint.every
            if ending or (every and run.step % every == 0) or run.step == cfg.train.max_steps:
                run.save()
            if ending:
                break
        if trials.abandon() is not None:  # the run ended inside a trial: its steps stand as they ran
            logger.info(f"a decision's trial steps were still running at step {run.step}; they were not redone")
            run.save()
        if not p.final_eval:  # resumed from the final checkpoint: the loop had nothing left to do
            p.final_eval = run.validate()
        p.finished = True
    finally:
        stop.restore()
        run.reporter.close()
        run.undo_settings()


def _start(run: Run) -> None:
    """Start the progress bar and the tracking sinks from the run's step on, and say how it resumed."""
    run.reporter.start(run.step)
    if run.resumed_from is None:
        return
    logger.info(f"resumed run {run.dir.id} from {run.resumed_from.name} (step {run.step})")
    if run.written != run.dist.batch_degree:
        n, accum = run.dist.batch_degree, run.strategies.plan.accum_steps
        logger.info(
            f"resuming step {run.step} of run {run.dir.id} on {n} data-parallel rank{'s' * (n > 1)} "
            f"(written by {run.written}): same global batch {run.per_rank * n * accum}"
            + (f", as {accum} micro-batches" if accum > 1 else "")
        )


def _log(run: Run, window: Window, samples_per_step: int) -> None:
    """Log a row with the window's loss and throughput and the strategies' and diagnostics'
    columns. Then the DDP monitor may adapt."""
    row = window.close(samples_per_step, run.dist)
    run.reporter.log(
        run.step,
        {
            "loss": row.pop("loss"),
            "lr": run.scheduler.get_last_lr()[0],
            **row,
            **run.strategies.metrics(run.step),
            **run.diagnostics.metrics(),
            "train_s": round(run.clock.seconds, 3),  # training seconds so far: fwk runs plot --x time
        },
    )
    run.strategies.comm.adapt(run.step)


def _evaluate(run: Run) -> bool:
    """Evaluate, log the result and keep the best checkpoint. Return True when the run ends
    here: its target is reached, or no evaluation was better in ``train.early_stop_patience``."""
    cfg, step = run.cfg, run.step
    run.progress.final_eval = result = run.validate()
    run.reporter.log(step, {**result, "train_s": round(run.clock.seconds, 3)}, kind="eval")
    said = run.best.after_eval(step, result, lambda at=step: run.resumable.state_dict(at))
    if said:
        logger.info(said)
    if run.target is not None and run.target.reached(result):
        run.clock.reached = {"step": step, "train_time_s": run.clock.seconds, "at": time.time()}
        logger.info(f"step {step}: {run.target} reached in {run.clock.seconds:.1f} s of training; stopping")
        return True
    if run.best.exhausted(cfg.train.early_stop_patience):
        logger.info(
            f"step {step}: no better {run.best.metric} in {cfg.train.early_stop_patience} evaluations; "
            "stopping (train.early_stop_patience)"
        )
        return True
    return False


def finish(run: Run) -> dict[str, Any]:
    """Return the finished run's summary. Rank 0 writes it to ``summary.json``."""
    p, dist, target = run.progress, run.dist, run.target
    methods = run.finish_methods()  # after the final evaluation: early_exit calibrates on val
    summary = {
        "run_id": run.dir.id,
        "status": "complete",
        "final_step": run.step,
        "eval": p.final_eval,
        **methods,
        "wall_time_s": time.perf_counter() - run.started,
        "first_step_at": p.first_step_at,
        "startup": startup.phases(p.first_step_at),
        "startup_memory_mib": startup.memory(),
        "train_time_s": p.train_time,
        "samples_per_s": p.samples / max(p.train_time, 1e-9),
        "data_wait": min(1.0, p.data_wait / max(p.train_time, 1e-9)),  # share of train time spent waiting for data
        "world_size": dist.world_size,
        **peak_memory(dist),
        "state_gib_per_rank": state_gib(run),
        **run.strategies.summary(),
        **run.diagnostics.summary(),
        **(
            {"target": {"stop_at": str(target), "reached": run.clock.reached is not None, **(run.clock.reached or {})}}
            if target
            else {}
        ),
        **({"best": {"metric": run.best.metric, "value": run.best.saved}} if run.best.active else {}),
        "replicas_in_sync": replicas_in_sync(run.model, dist, run.strategies.replica_group()),
    }
    if dist.is_main:
        run.dir.write_summary(summary)
    return summary


def peak_memory(dist: Dist) -> dict[str, float]:
    """Return the peak allocated device memory in GiB since the run began, the largest of any
    rank. On CUDA, memory=auto resets the counter around each trial step while it decides, so a
    run that decided late reports the peak since its last trial. The CPU keeps no such count,
    so there it is the largest resident set of any rank's process, libraries included."""
    if dist.device.type != "cuda":
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
        return {"peak_rss_gib": round(all_reduce_max([float(rss)], dist)[0] / 2**30, 3)}
    peak = torch.cuda.max_memory_allocated(dist.device)
    return {"peak_memory_gib": round(all_reduce_max([float(peak)], dist)[0] / 2**30, 3)}


def state_gib(run: Run) -> float:
    """Return the parameters and optimizer state that one rank holds at the end, in GiB, the
    largest of any rank. The gradients, as large as the parameters, are freed after each step.
    This is what sharding and splitting the model divide (``bench/cpu/parallel.txt``)."""

    def local(t: torch.Tensor) -> int:
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    held = sum(local(p) + (local(p.grad) if p.grad is not None else 0) for p in run.model.parameters())
    for state in run.optimizer.state.values():
        held += sum(local(v) for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    return round(all_reduce_max([float(held)], run.dist)[0] / 2**30, 4)
