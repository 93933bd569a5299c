"""The one launch path: resolved config -> checks -> plan -> already complete? -> preflight ->
launch -> report.

`fwk train`, every member of a sweep and `fwk replay` go through it. What differs between them
is passed in: what they print and where, the lineage they record, and whether the model checks
already ran.

1. ``plan_run``: the cheap checks of what the run reads, then the plan (run id, run dir,
   in-process or torchrun). No torch import: ``--dry-run`` stops here.
2. ``run``: a run whose summary exists is complete: it is (re)recorded in the index and
   reported, nothing trains. Otherwise ``preflight`` (the model built on the meta device,
   the strategies' patterns and device checked, the tracking server reached), then the
   launch (run dir, index, workers), then one line on how it ended.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fwk.config.resolve import Resolved, check_inputs
from fwk.launch.launcher import LaunchPlan, launch, plan
from fwk.launch.outcome import already_complete, finished
from fwk.track import index
from fwk.track.store import RunDir

logger = logging.getLogger(__name__)


@dataclass
class Job:
    """One run to launch: its config, its plan, and what its run dir records of its origin."""

    resolved: Resolved
    plan: LaunchPlan
    lineage: dict[str, str] = field(default_factory=dict)  # kept in meta.json if this launch creates the run
    overrides: list[str] | None = None  # the command's, for meta.json
    orders: dict[str, Any] = field(default_factory=dict)  # to its workers: RunDir.orders (--redecide, a replay's)

    def summary(self) -> dict[str, Any] | None:
        """Return the finished run's summary, or None. This is the one test of "already complete"."""
        return RunDir(self.plan.run_dir).read_summary()


@dataclass
class Result:
    outcome: str  # "already complete", "complete", "failed" or "interrupted"
    status: int  # the exit status to pass on (torchrun's, for several workers)
    run: RunDir
    summary: dict[str, Any] | None


def plan_run(resolved: Resolved, salt: str = "", checks: bool = True) -> LaunchPlan:
    """Run step 1: the cheap checks, then the plan. ``checks`` off skips the checks, since
    ``--cfg`` shows a config whose data is not there yet."""
    if checks:
        check_inputs(resolved.config)
    return plan(resolved, salt)


def preflight(job: Job) -> list[str]:
    """Check the model and the device, and reach the tracking server, before any run dir
    exists. This imports torch, which takes seconds, only for a run that will train and whose
    config asks something of the model or the device (``fwk.config.asks``). Return the lines to
    say first. They name a recipe's settings left out for an option picked over it, and an
    asked format that is slow on this device."""
    from fwk.components import sinks
    from fwk.config import accumulation, recipes
    from fwk.config.asks import asks
    from fwk.config.grammar import resources_root, typed_keys

    left_out = recipes.dropped(job.overrides or [], resources_root())
    notes = [d.line() for d in left_out if d.by_user]  # a recipe's settings for an optimizer not in use
    config, typed = job.resolved.config, typed_keys(job.overrides or [])
    notes += [*job.resolved.notes, *filter(None, [accumulation.warning(config.train.accum_steps)])]
    if asks(config, typed).anything:
        from fwk.strategies.preflight import preflight as check_model

        notes += check_model(config, typed)
    sinks.check_server(job.resolved.config.tracking)
    return notes


def run(
    job: Job,
    starting: str = "",
    done: Callable[[dict[str, Any], RunDir], str] | None = None,
    checked: bool = False,
) -> Result:
    """Run step 2, saying its lines through the module logger.

    ``starting`` is said before a launch. ``done(summary, run)`` words the already-complete
    line, by default with ``already_complete``. ``checked`` says that ``preflight(job)``
    already ran, as a sweep checks every member first."""
    summary = job.summary()
    if summary is not None:
        run_dir = RunDir(job.plan.run_dir)
        index.record_quietly(run_dir)  # an index rebuilt or copied without it learns of it here
        logger.info(done(summary, run_dir) if done else already_complete(summary, run_dir.path))
        return Result("already complete", 0, run_dir, summary)
    if starting:
        logger.info(starting)
    for line in preflight(job) if not checked else []:
        logger.info(line)
    config = job.resolved.config
    status, run_dir = launch(
        job.plan, job.resolved.as_yaml, config.parallel.nnodes, job.lineage, job.overrides, job.orders, config
    )
    summary = run_dir.read_summary()
    if status == 0 and summary is not None:
        logger.info(finished(summary, run_dir.path))
        return Result("complete", status, run_dir, summary)
    # a clean exit without a summary stopped at a step boundary; 128+N: torchrun's workers were signalled
    outcome = "interrupted" if status == 0 or status >= 128 else "failed"
    return Result(outcome, status, run_dir, summary)
