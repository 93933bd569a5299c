"""Plot loss and eval metrics of several runs, overlaid, over steps, training time or samples
seen, as one PNG (`fwk runs plot --x step|time|samples`).

Each run's ``train.stop_at`` crossing is marked, so that a fast recipe and a plain one compare
where it matters, at the same wall time.

Reads metrics.jsonl only; no torch. matplotlib is imported inside ``draw`` (it takes a
fraction of a second), and drawn through a bare Figure, which renders with Agg: no
display, no pyplot state, and no backend switched under a caller that has its own.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from fwk.errors import UserError
from fwk.track.store import RunDir

# metric name -> (x values, values), x ascending
Series = dict[str, tuple[list[float], list[float]]]
AXES = {"step": "step", "time": "training time (s)", "samples": "samples seen"}

TRAIN_LOSS = "loss"  # the train rows' key; the eval metrics are named by their own keys (val_loss, val_acc, ...)


def _number(value: object) -> float | None:
    """Return a finite float, or None. A NaN-skipped step logs a NaN loss, and a bool is no metric."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _samples_per_step(run: RunDir) -> int:
    from fwk.track.status import read_config

    train = read_config(run).get("train") or {}
    return int(train.get("batch_size", 1)) * int(train.get("accum_steps", 1))


def _x(row: dict, x: str, per_step: int) -> float | None:
    if x == "time":  # cumulative training seconds, logged with every row (train_s)
        return _number(row.get("train_s"))
    return float(row["step"] * (per_step if x == "samples" else 1))


def series(run: RunDir, x: str = "step") -> Series:
    """Return the train loss and every eval metric of ``run`` by ``x``, which is step, time or
    samples. Non-finite values are left out.

    A step logged twice (a resumed run that was killed between its checkpoint and its next
    log) keeps its last value; a half-written last line (a run still running) is skipped.
    """
    points: dict[str, dict[float, float]] = {}
    per_step = _samples_per_step(run) if x == "samples" else 1
    try:
        lines = run.metrics.read_text(errors="replace").splitlines()
    except OSError:
        return {}
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            continue
        if row.get("kind") == "train":
            wanted = {TRAIN_LOSS: row.get(TRAIN_LOSS)}
        elif row.get("kind") == "eval":
            wanted = {k: v for k, v in row.items() if k not in ("step", "kind", "train_s")}
        else:
            continue
        at = _x(row, x, per_step)
        if at is None:  # --x time on rows logged before fwk recorded train_s
            continue
        for name, value in wanted.items():
            number = _number(value)
            if number is not None:
                points.setdefault(name, {})[at] = number
    return {name: (sorted(by_step), [by_step[s] for s in sorted(by_step)]) for name, by_step in points.items()}


# Config keys that never tell runs apart in a legend: where they are stored, how they are labelled.
_NOT_LABELS = ("paths.", "tags", "recipe")  # the recipe is in every label already
MAX_LABEL_KEYS = 3


def differing(configs: list[dict]) -> list[str]:
    """Return the flattened config keys whose values differ between ``configs``, sorted and at
    most MAX_LABEL_KEYS. A legend names them to tell the runs apart."""
    from fwk.track.status import flatten

    flat = [flatten(c) for c in configs]
    keys = sorted({k for f in flat for k in f if not k.startswith(_NOT_LABELS)})
    return [k for k in keys if len({repr(f.get(k)) for f in flat}) > 1][:MAX_LABEL_KEYS]


def label(run: RunDir, keys: list[str] = ()) -> str:
    """Return the legend entry of a run: "id recipe key=value ... [tag, tag]"."""
    from fwk.track.status import flatten, read_config

    config = read_config(run)
    tags = config.get("tags")
    flat = flatten(config)
    text = " ".join([run.id, str(config.get("recipe") or "-"), *(f"{k}={flat.get(k, '-')}" for k in keys)])
    return text + (f" [{', '.join(str(t) for t in tags)}]" if isinstance(tags, list) and tags else "")


@dataclass(frozen=True)
class Curves:
    run: RunDir
    label: str
    series: Series
    target: float | None = None  # where the run reached its train.stop_at, on the x axis


def crossing(run: RunDir, x: str) -> float | None:
    """Return where ``run`` reached its ``train.stop_at`` target on axis ``x``, or None when it
    did not."""
    from fwk.track.status import read_json

    target = (read_json(run.summary) or {}).get("target") or {}
    if not target.get("reached"):
        return None
    if x == "time":
        return float(target["train_time_s"])
    return float(target["step"] * (_samples_per_step(run) if x == "samples" else 1))


def load(runs: list[RunDir], x: str = "step") -> list[Curves]:
    from fwk.track.status import read_config

    keys = differing([read_config(run) for run in runs]) if len(runs) > 1 else []
    return [Curves(run, label(run, keys), series(run, x), crossing(run, x)) for run in runs]


def metric_names(curves: list[Curves]) -> list[str]:
    """List the panels: train loss first, then each eval metric in the order the runs first log it."""
    names = [name for c in curves for name in c.series]
    return sorted(dict.fromkeys(names), key=lambda name: name != TRAIN_LOSS)


def no_data(runs: list[RunDir]) -> str:
    ids = ", ".join(r.id for r in runs)
    who = f"run {ids} has" if len(runs) == 1 else f"runs {ids} have"
    return f"{who} no metrics yet (no train or eval rows in metrics.jsonl)"


def with_data(curves: list[Curves]) -> list[Curves]:
    """Keep the curves that have something to draw. Raise a UserError naming the runs when none has."""
    have = [c for c in curves if c.series]
    if not have:
        raise UserError(f"{no_data([c.run for c in curves])}: nothing to plot until a run logs its first step")
    return have


def _grid(n: int) -> tuple[int, int]:
    """Return the rows and columns for n panels: one column up to 1, two up to 4, then three."""
    cols = 1 if n == 1 else 2 if n <= 4 else 3
    return math.ceil(n / cols), cols


def _log_scale(values: list[float]) -> bool:
    """Tell whether a loss spans two decades, which reads better on a log axis: the early steps
    flatten the rest."""
    return bool(values) and min(values) > 0 and max(values) / min(values) > 100


def draw(curves: list[Curves], out: Path, x: str = "step") -> Path:
    """Write the PNG of ``curves``, each with some series, to ``out``. Each run gets one
    colour, and a dashed line marks where a run reached its target."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    names = metric_names(curves)
    rows, cols = _grid(len(names))
    legend_rows = math.ceil(len(curves) / 2)
    # inches: 5 x 3.5 a panel, 0.3 a legend row below them; 100 dpi
    fig = Figure(figsize=(5.0 * cols, 3.5 * rows + 0.3 * legend_rows + 0.2), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    palette = colormaps["tab10" if len(curves) <= 10 else "tab20"]
    for ax, name in zip(axes.flat, names, strict=False):
        everything: list[float] = []
        for i, c in enumerate(curves):
            if name not in c.series:
                continue
            steps, values = c.series[name]
            everything += values
            # eval points are few (every eval_every steps): markers show where they were taken
            marker = "o" if name != TRAIN_LOSS or len(steps) == 1 else None
            ax.plot(steps, values, color=palette(i % palette.N), marker=marker, markersize=3, linewidth=1.2)
            if c.target is not None:
                ax.axvline(c.target, color=palette(i % palette.N), linestyle="--", linewidth=0.8)
        ax.set_title("train loss" if name == TRAIN_LOSS else name)
        ax.set_xlabel(AXES[x])
        ax.grid(alpha=0.3)
        if ("loss" in name or "ppl" in name) and _log_scale(everything):
            ax.set_yscale("log")
    for ax in axes.flat[len(names) :]:
        ax.set_visible(False)
    # one legend for all panels, below them, so that it covers no line
    handles = [Line2D([], [], color=palette(i % palette.N), linewidth=2) for i in range(len(curves))]
    fig.legend(handles, [c.label for c in curves], loc="outside lower center", ncols=min(len(curves), 2), frameon=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100, format="png")
    return out


def plot_runs(runs: list[RunDir], out: Path) -> Path:
    """Write a PNG of train loss and eval metrics over steps for ``runs``, overlaid, and return
    its path.

    Runs with no metrics rows yet are left out. Raise a UserError when none of them has any.
    """
    return draw(with_data(load(runs)), out)
