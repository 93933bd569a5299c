"""Time to target: fwk against the plain loop, each a whole process, from a cold start.

Every side is a process started by this one and timed from its start (imports, data, model
and every decision included) to the evaluation that first reaches the target
(``sides.py``): digits_cnn to val_acc >= 0.985; resnet_digits to 0.97; gpt_stdlib and
hf_llama_stdlib (a transformers Llama on the same bytes) to a val loss of 1.7 nats/byte. All
sides evaluate every ``train.eval_every`` steps on the same validation batches. The sides:

- ``plain (recipe)``: ``plain_loop.py``, fp32 eager PyTorch (bf16 autocast on a GPU), the
  recipe's optimizer, lr, batch and schedule;
- ``plain (tuned)``: the same loop with its cosine's length, its lr and, for a model with
  BatchNorm, its evaluation tuned as a careful user would: each point of the case's stated
  grid trained once (seed 0), the fastest to the target kept (``tune``);
- ``fwk cold``: ``fwk train recipe=...`` at the recipe's defaults (its autos deciding),
  stopped by its own ``train.stop_at``, with empty decision and compile caches: what a
  first run on a machine costs, trial steps and compiles included;
- ``fwk warm``: the same command again, with the caches the cold run just filled: every
  later run;
- ``fast cold`` and ``fast warm``: the case's fast recipe (``recipes/*_fast.yaml``: the
  same model, data, evaluation and target, faster training settings), likewise.

Rep i trains every side with seed i; the order of the sides turns from rep to rep (a cold
run always just before its warm one), so drift favours none. Rows: each fwk side's seconds
over a plain side's, per rep (median [min, max]); targets: a fast recipe <= 0.6x the tuned
plain loop, cold; a cold run <= 1.05x its warm one. Seed 0's curves over training seconds
go to ``bench/results/tta-<name>.png``.
"""

from __future__ import annotations

import itertools
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness import Row, Side, guarded, ratio_row
from benchmarks.sides import Outcome, fwk_side, plain_side, plain_spec


@dataclass(frozen=True)
class Case:
    overrides: list[str]
    metric: str
    target: float
    reps: int
    note: str
    fast: str | None = None
    grid: dict[str, list] = field(default_factory=dict)  # plain (tuned): spec changes, every combination


CASES = {  # name -> (full size, --quick size)
    "digits_cnn": (
        Case(
            ["recipe=digits_cnn", "train.eval_every=10"], "val_acc", 0.985, 5, "the issue's target", None,
            {"steps": [100, 200, 300], "lr_scale": [1, 2]},
        ),
        Case(["recipe=digits_cnn", "train.eval_every=10"], "val_acc", 0.95, 2, "--quick", None, {"steps": [100]}),
    ),
    "resnet_digits": (
        Case(
            ["recipe=resnet_digits", "train.eval_every=5", "train.max_steps=100"], "val_acc", 0.97, 2,
            "the issue's target; a 100-step budget, not the recipe's 60 (the plain loop misses 97% there on some "
            "seeds); 1-3 s a step on 2 cores: 2 reps",
            "resnet_digits_fast",
            {"steps": [60, 100], "lr_scale": [1, 2], "bn_recompute": [8]},  # 30 steps never reach 97%
        ),
        Case(
            ["recipe=resnet_digits", "train.eval_every=5", "data.image_size=16", "train.max_steps=20"], "val_acc",
            0.5, 1, "--quick: 16 px", "resnet_digits_fast", {"bn_recompute": [0, 8]},
        ),
    ),
    "gpt_stdlib": (
        Case(
            ["recipe=gpt_stdlib", "train.eval_every=25"], "val_loss", 1.7, 2,
            "the issue's target, the recipe's whole val set; ~1 min a run on 2 cores: 2 reps", "gpt_stdlib_fast",
            {"steps": [300, 450, 600], "lr_scale": [1, 2]},
        ),
        Case(
            ["recipe=gpt_stdlib", "train.eval_every=10", "train.eval_batches=2", "train.batch_size=8",
             "train.max_steps=40"],
            "val_loss", 3.5, 1, "--quick", "gpt_stdlib_fast", {"steps": [20, 40]},
        ),
    ),
    "hf_llama_stdlib": (  # gpt_stdlib's task and target with a Hugging Face transformers Llama (model=hf)
        Case(
            ["recipe=hf_llama_stdlib", "train.eval_every=25"], "val_loss", 1.7, 2,
            "gpt_stdlib's target with a transformers Llama; ~1.5 min a run on 2 cores: 2 reps", None,
            {"steps": [300, 450, 600], "lr_scale": [1, 2]},
        ),
        Case(
            ["recipe=hf_llama_stdlib", "train.eval_every=10", "train.eval_batches=2", "train.batch_size=8",
             "train.max_steps=40"],
            "val_loss", 3.5, 1, "--quick", None, {"steps": [20, 40]},
        ),
    ),
}  # fmt: skip


def tune(case: Case, base: list[str], work: Path, amp: str | None) -> tuple[dict, str]:
    """The grid point whose plain loop (seed 0) reached the target soonest, and a note of the grid."""
    keys = list(case.grid)
    tried: list[tuple[float, dict]] = []
    for values in itertools.product(*(case.grid[k] for k in keys)):
        changes = dict(zip(keys, values, strict=True))
        got = plain_side(plain_spec([*base, "seed=0"], amp=amp, **changes), case.metric, case.target, work)
        tried.append((got.seconds if got.reached else float("inf"), changes))
    seconds, best = min(tried, key=lambda t: t[0])
    shown = ", ".join(f"{k} {case.grid[k]}" for k in keys)
    if seconds == float("inf"):
        return {}, f"no point of the grid ({shown}) reached the target: tuned = recipe"
    return best, f"tuned over {shown} (seed 0): best {_point(best)}"


def _point(changes: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in changes.items()) or "the recipe's"


def one(name: str, quick: bool, device: str = "cpu", reps: int | None = None, tuned: bool = True) -> list[Row]:
    """The case's rows; ``device``: where every side trains (the GPU check: cuda, where the
    plain loop trains under bf16 autocast); ``reps``: seeds per side instead of the case's
    own; ``tuned``: False leaves the plain (tuned) side out (no grid)."""
    case = CASES[name][1 if quick else 0]
    reps = reps or case.reps
    amp = "bf16" if device == "cuda" else None
    base = [*case.overrides, "checkpoint.every=0", f"train.device={device}"]
    fast = [f"recipe={case.fast}", *base[1:]] if case.fast else None
    with tempfile.TemporaryDirectory(prefix="fwk-bench-tta-") as tmp:
        work = Path(tmp)
        best, tuning = tune(case, base, work, amp) if tuned and case.grid else ({}, "")
        plain = {"plain (recipe)": {}, **({"plain (tuned)": best} if tuning else {})}
        units = [*([("plain", p)] for p in plain), [("fwk", "cold"), ("fwk", "warm")]]
        units += [[("fast", "cold"), ("fast", "warm")]] if fast else []
        got: dict[str, list[Outcome]] = {}
        for rep in range(reps):
            for unit in units[rep % len(units) :] + units[: rep % len(units)]:
                cache = work / f"cache-{unit[0][0]}-{rep}"  # fresh for the cold run, filled for the warm one
                for side, how in unit:
                    label = how if side == "plain" else f"{side} {how}"
                    if side == "plain":
                        spec = plain_spec([*base, f"seed={rep}"], amp=amp, **plain[how])
                        out = plain_side(spec, case.metric, case.target, work, record=rep == 0)
                    else:
                        overrides = [*(base if side == "fwk" else fast), f"seed={rep}"]
                        out = fwk_side(overrides, case.metric, case.target, cache, work)
                    got.setdefault(label, []).append(out)
        curves = _plot(name, got, quick or device != "cpu")
    return _rows(name, case, got, tuning, curves)


def _plot(name: str, got: dict[str, list[Outcome]], aside: bool) -> str:
    """Seed 0's curves of the plain sides and the cold fwk sides; a smoke run or another
    device's go beside, not over, the repository's figure."""
    from fwk.track.plot import Curves, crossing, draw, series
    from fwk.track.store import RunDir

    results = Path(__file__).resolve().parents[1] / "bench" / "results"
    folder = Path(tempfile.mkdtemp(prefix="fwk-tta-plot-")) if aside else results
    shown = [label for label in got if not label.endswith("warm")]
    curves = [
        Curves(RunDir(p), label, series(RunDir(p), "time"), crossing(RunDir(p), "time"))
        for label in shown
        if (p := got[label][0].run_dir) is not None
    ]
    out = draw(curves, folder / f"tta-{name}.png", "time")
    return str(out.relative_to(results.parents[1])) if folder == results else str(out)


def _med(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def _seconds(runs: list[Outcome]) -> list[float]:
    """Each run's seconds to the target; a run that missed it counts its whole process (a bound)."""
    return [r.seconds if r.reached else r.wall for r in runs]


def _fig(x: float | None, unit: str = "s") -> str:
    return "-" if x is None else f"{x:.1f} {unit}" if x < 100 else f"{x:.0f} {unit}"


def _about(label: str, runs: list[Outcome], metric: str) -> str:
    missed = [i for i, r in enumerate(runs) if not r.reached]
    steps = _med([r.steps for r in runs])
    return (
        f"{label}: steps {steps:g}, training {_fig(_med([r.train_s for r in runs]))}, start-up "
        f"{_fig(_med([r.startup for r in runs]))}, peak {_fig(_med([r.peak_mb for r in runs]), 'MB')}"
        + (f", missed the target with seeds {missed} (its whole run counted)" if missed else "")
    )


def _ratio(name: str, what: str, a: str, b: str, got: dict, target: str, notes: str) -> Row:
    sa, sb = _seconds(got[a]), _seconds(got[b])
    ratios = [x / y for x, y in zip(sa, sb, strict=True)]
    return ratio_row(
        "tta", f"{name} to {what}: {a} / {b}", ratios, Side(a, statistics.median(sa), "s"),
        Side(b, statistics.median(sb), "s"), f"{a}/{b} seconds to target, whole process", target, notes,
    )  # fmt: skip


def _rows(name: str, case: Case, got: dict[str, list[Outcome]], tuning: str, curves: str) -> list[Row]:
    what = f"val_acc >= {case.target}" if case.metric == "val_acc" else f"val loss <= {case.target} nats/byte"
    reps = len(got["fwk cold"])
    tuned = f"; plain (tuned) {tuning}" if tuning else ""
    common = f"{case.note}; seeds 0-{reps - 1}{tuned}; curves: {curves}"
    about = {label: _about(label, runs, case.metric) for label, runs in got.items()}
    plain = "plain (tuned)" if "plain (tuned)" in got else "plain (recipe)"
    rows = []
    for side in [s for s in ("fwk", "fast") if f"{s} cold" in got]:
        cold, warm = f"{side} cold", f"{side} warm"
        fast = side == "fast"
        recipe = f"{case.fast if fast else name}: " if case.fast else ""
        notes = recipe + "; ".join([about[cold], about[warm], about[plain], common])
        rows.append(_ratio(name, what, cold, plain, got, "<= 0.6x" if fast else "", notes))
        if plain != "plain (recipe)":
            rows.append(_ratio(name, what, cold, "plain (recipe)", got, "", about["plain (recipe)"]))
        rows.append(_ratio(name, what, cold, warm, got, "<= 1.05x", "a first run on this machine against a later one"))
    rows.append(_startup_row(name, got["fwk cold"], got["plain (recipe)"]))
    return rows


def _startup_row(name: str, fwk: list[Outcome], plain: list[Outcome]) -> Row:
    """The start-up ratio, the difference in seconds, and each side's phases (medians)."""
    ratios = [(a.startup or 0) / (b.startup or 1) for a, b in zip(fwk, plain, strict=True)]
    gap = _med([(a.startup or 0) - (b.startup or 0) for a, b in zip(fwk, plain, strict=True)]) or 0.0
    notes = (
        f"fwk - plain: {gap:+.2f} s (bound: +0.5 s, {'met' if gap <= 0.5 else 'not met'}); "
        f"fwk's phases: {_phases(fwk)}; plain's: {_phases(plain)}"
    )
    a, b = (
        Side("fwk cold", _med([r.startup for r in fwk]) or 0, "s"),
        Side("plain", _med([r.startup for r in plain]) or 0, "s"),
    )
    what = "fwk/plain seconds from process start to the first training step"
    return ratio_row("tta", f"{name}: start-up, fwk cold / plain", ratios, a, b, what, "", notes)


def _phases(runs: list[Outcome]) -> str:
    """Each start-up phase's median seconds, in the order the first run lists them."""
    names = list((runs[0].phases or {}) if runs else {})
    return ", ".join(f"{n} {_med([(r.phases or {}).get(n) for r in runs]):.2f}" for n in names) or "not recorded"


def rows(quick: bool, cases: list[str] | None = None) -> list:
    """Every case's rows (only ``cases``, when named: ``python -m benchmarks --only tta:NAME``)."""
    return [r for name in cases or CASES for r in guarded("tta", name, lambda name=name: one(name, quick))]
