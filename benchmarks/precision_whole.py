"""precision=auto against the fixed formats, each a whole ``fwk train`` from a cold start.

The ``precision`` group times steps. A user pays for the whole command, auto's trial
included (its steps, redone once decided, or none when ``precision.max_trial_share`` finds
the run too short for it to pay). Here each README workload runs as ``fwk train`` under
precision=fp32, bf16 and auto, interleaved (the order turns each rep), each with a fresh
decision cache, as a first run on this machine. The row: auto's seconds over the best fixed
format's, rep by rep, against the 5% bound, with the line auto printed.
"""

from __future__ import annotations

import re
import statistics
import tempfile
from pathlib import Path

from benchmarks.harness import Row, Side, guarded, ratio_row
from benchmarks.sides import Outcome, fwk_side

CASES = {  # name -> (overrides, reps at full size)
    "digits_cnn": (["recipe=digits_cnn"], 3),
    "resnet_digits": (["recipe=resnet_digits"], 1),
    "gpt_stdlib@100": (["recipe=gpt_stdlib", "train.max_steps=100"], 2),
}
QUICK = ["train.max_steps=20", "train.eval_every=20"]
FORMATS = ("fp32", "bf16", "auto")
BOUND = 1.05


def _chose(run: Outcome) -> str:
    """Return what precision=auto said it chose, from the run's log."""
    log = (run.run_dir.parent / "fwk.log").read_text() if run.run_dir is not None else ""
    found = re.search(r"precision=auto chose (.*)", log)
    return found.group(1).strip() if found else "(no decision line)"


def _row(name: str, runs: dict[str, list[Outcome]]) -> Row:
    """Auto's whole-command seconds over the best fixed format's, rep by rep."""
    best = [min(runs["fp32"][i].wall, runs["bf16"][i].wall) for i in range(len(runs["auto"]))]
    ratios = [a.wall / b for a, b in zip(runs["auto"], best, strict=True)]
    fixed = {f: statistics.median(r.wall for r in runs[f]) for f in ("fp32", "bf16")}
    faster = min(fixed, key=fixed.__getitem__)
    a = Side("auto", statistics.median(r.wall for r in runs["auto"]), "s")
    b = Side(f"best fixed ({faster})", statistics.median(best), "s")
    notes = (
        f"fp32 {fixed['fp32']:.1f} s, bf16 {fixed['bf16']:.1f} s; {len(ratios)} rep(s), cold decision caches, "
        f"process start to exit; auto chose {_chose(runs['auto'][0])}"
    )
    return ratio_row(
        "precision_whole",
        f"{name}: precision=auto, whole fwk train",
        ratios,
        a,
        b,
        "auto/best fixed seconds",
        f"<= {BOUND}",
        notes,
    )


def one(name: str, quick: bool) -> list[Row]:
    overrides, reps = CASES[name]
    reps, extra = (1, QUICK) if quick else (reps, [])
    runs: dict[str, list[Outcome]] = {f: [] for f in FORMATS}
    with tempfile.TemporaryDirectory(prefix=f"fwk-precision-{name}-") as tmp:
        work = Path(tmp)
        for rep in range(reps):
            turn = FORMATS[rep % 3 :] + FORMATS[: rep % 3]
            for fmt in turn:
                cache = work / f"cache-{rep}-{fmt}"  # fresh: a first run on this machine
                argv = [*overrides, *extra, "checkpoint.every=0", f"precision={fmt}"]
                runs[fmt].append(fwk_side(argv, "val_loss", 0.0, cache, work, stop=False))
        return [_row(name, runs)]


def rows(quick: bool, cases: list[str] | None = None) -> list[Row]:
    """Every case's row (only ``cases``, when named: ``python -m benchmarks --only precision_whole:NAME``)."""
    return [r for name in cases or CASES for r in guarded("precision_whole", name, lambda name=name: one(name, quick))]
