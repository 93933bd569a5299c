"""`fwk train -m`: compose and check a sweep's runs up front, then run them one after another.

Every member is an ordinary run (its own content-addressed run id and run dir), launched the
way `fwk train` launches one run: in this process for one worker, through torchrun for
several, so a sweep over ``parallel.nproc_per_node`` just works (each torchrun is
``--standalone``: it picks a free port, and the previous one has exited). Running the same
sweep again finds the same sweep id: finished members say so, unfinished ones resume.
A failed member does not stop the sweep; Ctrl-C does (the member stops at a step boundary,
as a single run does, and no further member starts).
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fwk.config.resolve import Resolved, resolve
from fwk.config.sweep import Combination, expand
from fwk.errors import UserError
from fwk.launch.launcher import LaunchPlan
from fwk.launch.run import Job, plan_run, preflight, run
from fwk.track.sweeps import sweep_id, write_sweep

logger = logging.getLogger(__name__)


@dataclass
class Member:
    number: int  # 1-based, in the order of the combinations
    combination: Combination
    resolved: Resolved
    plan: LaunchPlan

    def job(self, sweep_id: str, orders: dict[str, Any] | None = None) -> Job:
        lineage = {"sweep": sweep_id, "kind": "sweep"}  # kept only if this launch creates the run
        return Job(self.resolved, self.plan, lineage, list(self.combination.overrides), dict(orders or {}))


@dataclass
class Sweep:
    id: str
    root: Path
    overrides: list[str]  # the command's, as typed
    keys: list[str]  # the swept keys, in the order of the command
    members: list[Member]

    def header(self, m: Member) -> str:
        return f"sweep {self.id} run {m.number}/{len(self.members)}: {m.combination.label()} -> run {m.plan.run_id}"

    def title(self) -> str:
        runs = f"{len(self.members)} run" + ("s" if len(self.members) > 1 else "")
        return f"sweep {self.id}: {runs} over {', '.join(self.keys) or 'no key'}"

    def describe(self) -> str:
        """Return what `--dry-run` prints: the sweep, then each member's run id and launch line."""
        lines = [self.title()]
        for m in self.members:
            lines.append(self.header(m))
            lines += [f"  {line}" for line in m.plan.describe().splitlines()]
        return "\n".join(lines)

    def configs(self) -> str:
        """Return what `--cfg` prints: each member's resolved config, as YAML documents."""
        return "".join(
            f"---\n# sweep run {m.number}/{len(self.members)}: {m.combination.label()}\n{m.resolved.as_yaml}"
            for m in self.members
        )

    def record(self) -> dict[str, Any]:
        return {
            "sweep_id": self.id,
            "overrides": self.overrides,
            "swept": self.keys,
            "members": [
                {
                    "run_id": m.plan.run_id,
                    "overrides": list(m.combination.overrides),
                    "values": dict(m.combination.values),
                }
                for m in self.members
            ],
        }


@contextmanager
def _naming(number: int, total: int, combination: Combination) -> Iterator[None]:
    """Make a user's mistake in one combination name it, so that the whole sweep fails on that
    one line."""
    try:
        yield
    except UserError as exc:
        raise type(exc)(f"sweep run {number}/{total} ({combination.label()}): {exc}") from None


def prepare(overrides: list[str], checks: bool = True) -> Sweep:
    """Expand, compose, validate and plan every combination. Nothing runs, and nothing is written."""
    keys, combinations = expand(overrides)
    members = []
    for number, combination in enumerate(combinations, 1):
        with _naming(number, len(combinations), combination):
            resolved = resolve(list(combination.overrides))
            members.append(Member(number, combination, resolved, plan_run(resolved, checks=checks)))
    _check_distinct(members)
    return Sweep(sweep_id([m.plan.run_id for m in members]), members[0].plan.run_dir.parent, overrides, keys, members)


def _check_distinct(members: list[Member]) -> None:
    """Check that the members are distinct runs under one runs root, where the sweep's record lives."""
    roots = {m.plan.run_dir.parent for m in members}
    if len(roots) > 1:
        raise UserError(f"a sweep's runs share one runs root, not {len(roots)}; do not sweep paths.runs")
    seen: dict[str, Member] = {}
    for m in members:
        first = seen.setdefault(m.plan.run_id, m)
        if first is not m:
            raise UserError(
                f"sweep runs {first.number} ({first.combination.label()}) and {m.number} ({m.combination.label()}) "
                f"are the same run {m.plan.run_id} (only tags, paths or process counts differ); "
                "sweep a key that changes training"
            )


@dataclass
class Outcome:
    failed: list[Member] = field(default_factory=list)
    stopped: Member | None = None  # the member during which the sweep was interrupted

    @property
    def status(self) -> int:
        return 130 if self.stopped else 1 if self.failed else 0

    def last_line(self, sweep: Sweep) -> str | None:
        """Return the closing line on stderr of a sweep that did not finish every run, else None."""
        if self.stopped is not None:
            return (
                f"fwk: sweep {sweep.id} stopped during run {self.stopped.number}/{len(sweep.members)}; "
                "run the same command again to go on"
            )
        if self.failed:
            names = ", ".join(f"{m.number} ({m.combination.label()}, run {m.plan.run_id})" for m in self.failed)
            return f"fwk: error: sweep {sweep.id}: {len(self.failed)} of {len(sweep.members)} runs failed: {names}"
        return None


def run_sweep(sweep: Sweep, orders: dict[str, Any] | None = None) -> Outcome:
    """Run each member in turn, after the model and device checks of every unfinished one.
    ``orders`` go to every member's workers (``--redecide``)."""
    jobs = {m.number: m.job(sweep.id, orders) for m in sweep.members}
    for m in sweep.members:
        if jobs[m.number].summary() is None:  # torch is imported only when there is something to train
            with _naming(m.number, len(sweep.members), m.combination):
                preflight(jobs[m.number])
    path = write_sweep(sweep.root, sweep.record())
    logger.info(f"{sweep.title()} ({path})")
    outcome = Outcome()
    for m in sweep.members:
        logger.info(sweep.header(m))
        result = _run_member(jobs[m.number])
        if result == "failed":
            outcome.failed.append(m)
        elif result == "interrupted":
            outcome.stopped = m
            break
    return outcome


def _run_member(job: Job) -> str:
    """Run one member as `fwk train` runs one run: "complete", "failed" or "interrupted"."""
    try:
        result = run(job, checked=True)
    except KeyboardInterrupt:  # a second Ctrl-C, or one before the loop took over the signal
        return "interrupted"
    except UserError as exc:  # the member's own one line (diverged, bad data, already running)
        print(f"fwk: error: {exc}", file=sys.stderr, flush=True)
        return "failed"
    except Exception:  # noqa: BLE001 - our bug in one in-process member: its traceback, then the next
        traceback.print_exc()
        return "failed"
    return "complete" if result.outcome == "already complete" else result.outcome
