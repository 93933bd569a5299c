"""One-line reports of a run's outcome, shared by `fwk train` and later commands."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def metrics_text(metrics: dict[str, Any]) -> str:
    parts = []
    for key, value in metrics.items():
        parts.append(f"{key} {value:.4f}" if isinstance(value, float) else f"{key} {value}")
    return ", ".join(parts)


def finished(summary: dict[str, Any], run_dir: Path) -> str:
    return (
        f"run {summary['run_id']} complete: step {summary['final_step']}, {metrics_text(summary['eval'])}, "
        f"{summary['wall_time_s']:.1f} s, {summary['samples_per_s']:.0f} samples/s ({run_dir / 'summary.json'})"
    )


def already_complete(summary: dict[str, Any], run_dir: Path) -> str:
    return (
        f"run {summary['run_id']} is already complete (step {summary['final_step']}, "
        f"{metrics_text(summary['eval'])}); nothing to do. Summary: {run_dir / 'summary.json'}. "
        "Change a setting or seed=N to train a new run."
    )
