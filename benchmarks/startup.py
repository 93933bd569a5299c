"""Where the start-up goes: ``fwk train`` against the plain loop, phase by phase, per default recipe.

Each side is a whole process from a cold start (a fresh decision cache), timed from the
moment it is started to its first training step, as ``benchmarks/sides.py`` times them. Both
write their phases to summary.json (``fwk/track/startup.py``): fwk's launcher and worker
mark theirs (python, config, launch, imports, tracking, data, model, strategies, optimizer,
loaders, checkpoint), the plain loop its own (imports, data, model, optimizer). The sides
alternate, plain first, then fwk first.

A row per recipe: fwk/plain start-up, the gap in seconds against the 0.5 s bound, and both
sides' phases. A row per fwk phase that the plain loop has no counterpart for, with what it
holds and what would remove it, so that what fwk adds is named row by row.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
from pathlib import Path

from benchmarks.harness import Row, Side, guarded, ratio_row
from benchmarks.sides import Outcome, fwk_side, plain_side, plain_spec

CASES = {  # name -> (overrides, reps at full size)
    "digits_cnn": (["recipe=digits_cnn"], 5),
    "resnet_digits": (["recipe=resnet_digits"], 3),
    "gpt_stdlib": (["recipe=gpt_stdlib"], 3),
}
ONE_STEP = ["train.max_steps=1", "train.eval_every=1", "checkpoint.every=0"]  # the evaluation comes after the step
# fwk's phases that a plain loop does not have: what each holds, and what would remove it
ADDED = {
    "python": "the interpreter, fwk's command line (typer, 0.05 s; below 0.29, whose pydantic coercion cost "
    "0.15 s more) and its subcommands' modules, whose own imports wait for their command",
    "config": "Hydra's import (0.13 s) and compose (0.13 s, its structured schemas 0.04 s), the schema's "
    "validation (0.1 s with its import); a command composed before reads the composed config back (see the "
    "row 'the same command again'): what is left is the validation",
    "launch": "the run id (git for the code version), the run dir, its lock, the index; little left to remove",
    "tracking": "the sinks (the config is passed typed to a worker in the same process)",
    "loaders": "loader=auto's plan; in-memory data measures nothing",
    "checkpoint": "looking for a checkpoint to resume from; none on a first run",
    "other": "the loop's set-up and the TensorBoard event file (fwk/components/events.py)",
}


def _median(runs: list[Outcome], phase: str) -> float:
    return statistics.median((r.phases or {}).get(phase, 0.0) for r in runs)


def _phases(runs: list[Outcome]) -> str:
    return ", ".join(f"{p} {_median(runs, p):.2f}" for p in (runs[0].phases or {}))


def one(name: str, quick: bool) -> list[Row]:
    """Start both sides ``reps`` times each, interleaved, and return the recipe's rows."""
    overrides, reps = CASES[name]
    reps = 1 if quick else reps
    fwk: list[Outcome] = []
    again: list[Outcome] = []
    plain: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix=f"fwk-startup-{name}-") as tmp:
        work = Path(tmp)
        for rep in range(reps):
            sides = [
                lambda: plain.append(plain_side(plain_spec([*overrides, *ONE_STEP]), "val_loss", 0.0, work)),
                lambda rep=rep: _fwk_twice([*overrides, *ONE_STEP], work / f"rep-{rep}", fwk, again),
            ]
            for side in sides if rep % 2 == 0 else reversed(sides):
                side()
    return _rows(name, fwk, plain, again)


def _fwk_twice(overrides: list[str], work: Path, first: list[Outcome], again: list[Outcome]) -> None:
    """Start ``fwk train`` as a first command on this machine, then the same command again
    with its run dir removed (as after ``fwk runs rm``). The second finds the composed config
    in the cache (fwk/config/compose_cache.py) but no decisions, so only the compose differs."""
    work.mkdir(parents=True)
    runs = work / "runs"
    runs.mkdir()
    cold = work / "cache"  # a first run on this machine: nothing to recall
    first.append(fwk_side(overrides, "val_loss", 0.0, cold, work, stop=False, runs=runs))
    for run_dir in [p for p in runs.iterdir() if p.is_dir()]:
        shutil.rmtree(run_dir)
    composed = work / "cache-composed"  # decisions cold again; the composed configs kept
    shutil.copytree(cold / "fwk" / "compose", composed / "fwk" / "compose")
    again.append(fwk_side(overrides, "val_loss", 0.0, composed, work, stop=False, runs=runs))


def _versus(fwk: list[Outcome], plain: list[Outcome]) -> tuple[list[float], Side, Side, str]:
    """Per-rep start-up ratios, each side's median, and the gap against the 0.5 s bound, in words."""
    ratios = [(a.startup or 0) / (b.startup or 1) for a, b in zip(fwk, plain, strict=True)]
    gap = statistics.median((a.startup or 0) - (b.startup or 0) for a, b in zip(fwk, plain, strict=True))
    a = Side("fwk", statistics.median(r.startup or 0 for r in fwk), "s")
    b = Side("plain", statistics.median(r.startup or 0 for r in plain), "s")
    said = f"fwk - plain: {gap:+.2f} s (bound: +0.5 s, {'met' if gap <= 0.5 else 'not met'}); {len(fwk)} reps"
    return ratios, a, b, said


def _rows(name: str, fwk: list[Outcome], plain: list[Outcome], again: list[Outcome] | None = None) -> list[Row]:
    ratios, a, b, said = _versus(fwk, plain)
    notes = f"{said}, cold; fwk's phases: {_phases(fwk)}; plain's: {_phases(plain)}"
    rows = [ratio_row("startup", f"{name}: process start to first step", ratios, a, b, "fwk/plain seconds", "", notes)]
    if again:
        rows.append(_again_row(name, again, plain))
    if all(r.memory for r in [*fwk, *plain]):
        rows.append(_memory_row(name, fwk, plain))
    for phase, what in ADDED.items():
        seconds = _median(fwk, phase)
        if seconds > 0:
            rows.append(Row("startup", f"{name}: fwk's {phase}", "", notes=f"{seconds:.3f} s: {what}"))
    return rows


def _mib(runs: list[Outcome], phase: str) -> float:
    return statistics.median((r.memory or {}).get(phase, 0.0) for r in runs)


def _memory_row(name: str, fwk: list[Outcome], plain: list[Outcome]) -> Row:
    """The resident memory at the first step, and what each phase added to it, on both sides."""
    pairs = zip(fwk, plain, strict=True)
    ratios = [(a.memory or {})["at_first_step"] / (b.memory or {})["at_first_step"] for a, b in pairs]
    a = Side("fwk", _mib(fwk, "at_first_step"), "MiB")
    b = Side("plain", _mib(plain, "at_first_step"), "MiB")

    def added(runs: list[Outcome]) -> str:
        names = [k for k in (runs[0].memory or {}) if k != "at_first_step"]
        return ", ".join(f"{k} {_mib(runs, k):.0f}" for k in names)

    notes = f"fwk - plain: {a.value - b.value:+.0f} MiB; MiB each phase added, fwk: {added(fwk)}; plain: {added(plain)}"
    return ratio_row("startup", f"{name}: resident memory at the first step", ratios, a, b, "fwk/plain MiB", "", notes)


def _again_row(name: str, again: list[Outcome], plain: list[Outcome]) -> Row:
    """The same command started again, its config composed before: the start-up with Hydra cached."""
    ratios, a, b, said = _versus(again, plain)
    notes = (
        f"{said}, decisions cold, config composed before (a rerun, or --cfg/--dry-run first); "
        f"config {_median(again, 'config'):.3f} s"
    )
    return ratio_row("startup", f"{name}: the same command again", ratios, a, b, "fwk/plain seconds", "", notes)


def rows(quick: bool, cases: list[str] | None = None) -> list[Row]:
    """Every case's rows (only ``cases``, when named: ``python -m benchmarks --only startup:NAME``)."""
    return [r for name in cases or CASES for r in guarded("startup", name, lambda name=name: one(name, quick))]
