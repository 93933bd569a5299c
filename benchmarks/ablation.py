"""Ablation: each speed-up method and optimizer alone on a plain recipe, against that recipe.

Every variant is ``fwk train`` of the recipe with one change (``methods=[ema]``,
``optim=muon ...``), as a whole process with empty decision and compile caches (cold: what
a first run costs, trial steps included; ``sides.py``), seeds 0-2, the variants and the
recipe interleaved (the order rotates from seed to seed). Per variant: the ratio of its
training seconds to the target against the recipe's with the same seed (median [min, max]
over seeds; < 1 is faster), the steps it took, and its final metric.

- digits_cnn (the default recipe, to val_acc >= 0.985) trains its whole 300-step budget:
  the time to target is read from its evaluation rows (every 10 steps), and the final
  metric is the budget's last evaluation.
- gpt_stdlib (to val loss <= 1.7 nats/byte) stops at the target (``train.stop_at``): a whole
  900-step run per variant and seed would take ~35 minutes on 2 cores, so its final metric
  is not measured here (``tta``'s fast-recipe row has the full-budget comparison).

A variant that never reaches the target is a row saying so, with its final metric.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from benchmarks.harness import Row, Side, guarded, ratio_row
from benchmarks.sides import fwk_side

MUON = ["optim=muon", "optim.lr=1.5e-2", "optim.beta2=0.95", "optim.weight_decay=0.1"]  # gpt_stdlib_fast's
CASES = {  # recipe -> (its overrides, metric, target, whole budget?, variants: name -> overrides)
    "digits_cnn": (
        ["recipe=digits_cnn", "train.eval_every=10"],
        "val_acc",
        0.985,
        True,
        {
            "ema": ["methods=[ema]", "method.ema.half_life=20"],
            "label_smoothing": ["methods=[label_smoothing]"],
            "progressive_resize": ["methods=[progressive_resize]"],
            "prune_gradually": ["methods=[prune_gradually]"],
            "adamw_schedulefree": ["optim=adamw_schedulefree", "optim.lr=3e-3"],
            "muon": ["optim=muon", "optim.lr=3e-3"],
            "schedule=wsd": ["schedule=wsd"],
        },
    ),
    "gpt_stdlib": (
        ["recipe=gpt_stdlib", "train.eval_every=50"],
        "val_loss",
        1.7,
        False,
        {
            "muon": MUON,
            "seq_warmup": ["methods=[seq_warmup]"],
            "schedule=wsd": ["schedule=wsd"],
            "ema": ["methods=[ema]"],
            "adamw_schedulefree": ["optim=adamw_schedulefree", "optim.lr=5e-3", "optim.beta2=0.95"],
            "prune_gradually": ["methods=[prune_gradually]"],
        },
    ),
}
QUICK = {"digits_cnn": ["train.max_steps=60", "train.batch_size=32"], "gpt_stdlib": ["train.batch_size=8"]}
QUICK_TARGET = {"digits_cnn": 0.9, "gpt_stdlib": 3.5}


def _met(value: float | None, metric: str, target: float) -> bool:
    return value is not None and (value >= target if metric == "val_acc" else value <= target)


def run(overrides: list[str], metric: str, target: float, stop: bool, work: Path) -> dict:
    """One cold ``fwk train`` process: the training seconds and step of its first evaluation
    at the target (None: never), its final metric, and its whole-process seconds."""
    cache = Path(tempfile.mkdtemp(prefix="cache-", dir=work))  # empty: a first run here
    got = fwk_side([*overrides, "checkpoint.every=0", "train.device=cpu"], metric, target, cache, work, stop)
    rows = [json.loads(line) for line in (got.run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    hit = next((r for r in rows if r.get("kind") == "eval" and _met(r.get(metric), metric, target)), None)
    return {
        "seconds": hit["train_s"] if hit else None,
        "step": hit["step"] if hit else None,
        "final": got.final,
        "process": got.seconds,
    }


def one(recipe: str, quick: bool) -> list[Row]:
    base, metric, target, whole, variants = CASES[recipe]
    if quick:
        base, target, variants = [*base, *QUICK[recipe]], QUICK_TARGET[recipe], dict(list(variants.items())[:2])
    sides = {"recipe": [], **variants}
    got: dict[str, list[dict]] = {s: [] for s in sides}
    with tempfile.TemporaryDirectory(prefix="fwk-bench-ablation-") as tmp:
        for seed in range(3):
            order = list(sides)[seed % len(sides) :] + list(sides)[: seed % len(sides)]
            for side in order:
                got[side].append(run([*base, *sides[side], f"seed={seed}"], metric, target, not whole, Path(tmp)))
    what = f"val_acc >= {target}" if metric == "val_acc" else f"val loss <= {target} nats/byte"
    out = []
    for side in variants:
        pairs = [(v, b) for v, b in zip(got[side], got["recipe"], strict=True) if v["seconds"] and b["seconds"]]
        finals = [r["final"] for r in got[side] if r["final"] is not None]
        final = f"final {metric} {statistics.median(finals):.4g}" if whole and finals else "final not measured"
        base_final = [r["final"] for r in got["recipe"] if r["final"] is not None]
        final += f" (recipe {statistics.median(base_final):.4g})" if whole and base_final else ""
        name = f"{recipe} + {side} to {what}"
        if len(pairs) < 2:
            out.append(Row("ablation", name, notes=f"reached the target in {len(pairs)} of 3 seeds; {final}"))
            continue
        steps = statistics.median(v["step"] for v, _ in pairs)
        base_steps = statistics.median(b["step"] for _, b in pairs)
        out.append(
            ratio_row(
                "ablation",
                name,
                [v["seconds"] / b["seconds"] for v, b in pairs],
                Side(side, statistics.median(v["seconds"] for v, _ in pairs), "s"),
                Side(recipe, statistics.median(b["seconds"] for _, b in pairs), "s"),
                "variant/recipe training seconds to target",
                "",
                f"steps {steps:g} vs {base_steps:g}; {final}; seeds with both at the target: {len(pairs)} of 3; "
                f"cold (empty caches){_process(pairs)}",
            )
        )
    return out


def _process(pairs: list[tuple[dict, dict]]) -> str:
    """The whole processes' seconds to the target, where the runs stopped there."""
    v = [a["process"] for a, _ in pairs if a["process"]]
    b = [b["process"] for _, b in pairs if b["process"]]
    return f"; whole process {statistics.median(v):.1f} s vs {statistics.median(b):.1f} s" if v and b else ""


def rows(quick: bool, cases: list[str] | None = None) -> list:
    """Every case's rows (only ``cases``, when named: ``python -m benchmarks --only ablation:NAME``)."""
    return [r for name in cases or CASES for r in guarded("ablation", name, lambda name=name: one(name, quick))]
