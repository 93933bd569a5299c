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
    "python": "the interpreter, fwk's command line (typer) and its subcommands' modules",
    "config": "Hydra's import and compose, the schema's validation; removed by a faster compose or a cached one",
    "launch": "the run id (git for the code version), the run dir, its lock, the index; little left to remove",
    "tracking": "the recorded config read back and validated again, the sinks; removed by passing the typed config",
    "loaders": "loader=auto's plan; in-memory data measures nothing",
    "checkpoint": "looking for a checkpoint to resume from; none on a first run",
    "other": "the TensorBoard writer (torch.utils.tensorboard's import) and the loop's set-up; a lighter writer",
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
    plain: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix=f"fwk-startup-{name}-") as tmp:
        work = Path(tmp)
        for rep in range(reps):
            cold = work / f"cache-{rep}"  # a first run on this machine: no decisions to recall
            sides = [
                lambda: plain.append(plain_side(plain_spec([*overrides, *ONE_STEP]), "val_loss", 0.0, work)),
                lambda cold=cold: fwk.append(
                    fwk_side([*overrides, *ONE_STEP], "val_loss", 0.0, cold, work, stop=False)
                ),
            ]
            for side in sides if rep % 2 == 0 else reversed(sides):
                side()
    return _rows(name, fwk, plain)


def _rows(name: str, fwk: list[Outcome], plain: list[Outcome]) -> list[Row]:
    ratios = [(a.startup or 0) / (b.startup or 1) for a, b in zip(fwk, plain, strict=True)]
    gap = statistics.median((a.startup or 0) - (b.startup or 0) for a, b in zip(fwk, plain, strict=True))
    a = Side("fwk", statistics.median(r.startup or 0 for r in fwk), "s")
    b = Side("plain", statistics.median(r.startup or 0 for r in plain), "s")
    notes = (
        f"fwk - plain: {gap:+.2f} s (bound: +0.5 s, {'met' if gap <= 0.5 else 'not met'}); {len(fwk)} reps, cold; "
        f"fwk's phases: {_phases(fwk)}; plain's: {_phases(plain)}"
    )
    rows = [ratio_row("startup", f"{name}: process start to first step", ratios, a, b, "fwk/plain seconds", "", notes)]
    for phase, what in ADDED.items():
        seconds = _median(fwk, phase)
        if seconds > 0:
            rows.append(Row("startup", f"{name}: fwk's {phase}", "", notes=f"{seconds:.3f} s: {what}"))
    return rows


def rows(quick: bool, cases: list[str] | None = None) -> list[Row]:
    """Every case's rows (only ``cases``, when named: ``python -m benchmarks --only startup:NAME``)."""
    return [r for name in cases or CASES for r in guarded("startup", name, lambda name=name: one(name, quick))]
