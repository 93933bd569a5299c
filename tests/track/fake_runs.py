"""Run dirs made by hand (config.yaml, meta.json, metrics.jsonl, summary.json): no training."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml

from fwk.track.store import RunDir


def make_run(
    root: Path,
    run_id: str,
    recipe: str = "digits_cnn",
    lr: float = 1e-3,
    steps: int = 10,
    losses: tuple[float, ...] = (2.3, 1.9),
    eval_metrics: dict[str, float] | None = None,
    evals: dict[int, dict[str, float]] | None = None,
    tags: list[str] | None = None,
    created: float | None = None,
    outcome: str | None = None,
    checkpoint: bool = False,
) -> RunDir:
    """A run dir; complete (with summary.json) when ``eval_metrics`` is given.

    ``losses`` are train rows at steps 1, 2, ...; ``evals`` are eval rows, {step: metrics}.
    """
    run = RunDir(root / run_id)
    run.path.mkdir(parents=True)
    config: dict[str, Any] = {"recipe": recipe, "seed": 0, "optim": {"lr": lr}, "train": {"max_steps": steps}}
    if tags is not None:
        config["tags"] = tags
    run.config.write_text(yaml.safe_dump(config))
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(created or time.time()))
    launch: dict[str, Any] = {"time": stamp, "host": "h", "argv": ["fwk", "train"]}
    if outcome:
        launch["outcome"] = outcome
    run.meta.write_text(json.dumps({"run_id": run_id, "created": stamp, "launches": [launch]}))
    rows = [{"step": i + 1, "kind": "train", "loss": loss} for i, loss in enumerate(losses)]
    rows += [{"step": step, "kind": "eval", **metrics} for step, metrics in (evals or {}).items()]
    rows.sort(key=lambda r: r["step"])  # stable: a step's train row before its eval row, as the trainer logs
    run.metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if checkpoint:
        (run.checkpoints / "step_2").mkdir(parents=True)
    if eval_metrics is not None:
        run.write_summary({"run_id": run_id, "final_step": steps, "eval": eval_metrics})
    return run
