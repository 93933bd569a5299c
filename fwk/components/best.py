"""The best checkpoint by an evaluation metric (``checkpoint.best``), and early stopping.

After each evaluation the keeper compares the metric with the best one it saved. A value better
by at least ``min_improvement`` is saved at once, as a full checkpoint in
``<run>/checkpoints-best/`` with ``best.json`` naming the metric, value and step. A smaller
gain is saved once ``patience`` evaluations have passed without a save.
``train.early_stop_patience`` ends the run after that many evaluations in a row with no new
best. Its state is part of the run's checkpoint, so a resumed run ranks as before.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fwk.components.checkpoint import Checkpointer
from fwk.config.schema import CheckpointConfig
from fwk.config.target import EVAL_METRICS
from fwk.distributed.group import Dist
from fwk.track.store import write_atomic

BEST_DIR = "checkpoints-best"
BEST_FILE = "best.json"


def read_best(run_path: Path) -> dict[str, Any] | None:
    """Return what the run's best checkpoint holds: its metric, value, step and path. Return
    None when it has none."""
    try:
        best = json.loads((run_path / BEST_DIR / BEST_FILE).read_text())
    except (OSError, ValueError):
        return None
    path = run_path / BEST_DIR / str(best.get("checkpoint", ""))
    return {**best, "path": path} if (path / "manifest.json").is_file() else None


class BestKeeper:
    def __init__(self, cfg: CheckpointConfig, run_path: Path, dist: Dist, sharded: bool) -> None:
        self.cfg, self.metric = cfg, cfg.best
        self.maximize = EVAL_METRICS.get(cfg.best) == "max"
        self.root = run_path / BEST_DIR
        # keep=2: the best that best.json names stays until best.json names the new one; then
        # keep_only removes it. A run killed in between keeps a best.json that names a checkpoint.
        self.checkpointer = Checkpointer(self.root, dist, keep=2, on_corrupt="error", sharded=sharded)
        self.dist = dist
        self.saved: float | None = None  # the metric of the saved best checkpoint
        self.best: float | None = None  # the best value seen
        self.since_saved = 0  # evaluations since the last save
        self.since_best = 0  # evaluations since the best value improved

    @property
    def active(self) -> bool:
        return bool(self.metric)

    def _gain(self, value: float, than: float | None) -> float:
        if than is None:
            return float("inf")
        return value - than if self.maximize else than - value

    def after_eval(self, step: int, row: dict[str, Any], state: Callable[[], dict[str, Any]]) -> str | None:
        """Rank this evaluation, and save ``state()`` as the best checkpoint when it is one.
        Saving is a collective, and every rank sees the same row. Return the line to say."""
        if not self.active or self.metric not in row:
            return None
        value = float(row[self.metric])
        if self._gain(value, self.best) > 0:
            self.best, self.since_best = value, 0
        else:
            self.since_best += 1
        gain = self._gain(value, self.saved)
        due = self.cfg.patience > 0 and self.since_saved + 1 >= self.cfg.patience
        if gain > 0 and (gain >= self.cfg.min_improvement or due):
            path = self.checkpointer.save(step, state())
            if self.dist.is_main:
                best = {"metric": self.metric, "value": value, "step": step, "checkpoint": path.name}
                write_atomic(self.root / BEST_FILE, json.dumps(best, indent=2) + "\n")
                self.checkpointer.keep_only(path)
            before = "" if self.saved is None else f", was {self.saved:.4g}"
            self.saved, self.since_saved = value, 0
            return f"step {step}: best {self.metric} {value:.4g}{before}; saved in {self.root.name}/"
        self.since_saved += 1
        return None

    def exhausted(self, patience: int) -> bool:
        """Tell whether ``train.early_stop_patience`` evaluations in a row passed without a new best."""
        return self.active and patience > 0 and self.since_best >= patience

    def state_dict(self) -> dict[str, Any]:
        return {"saved": self.saved, "best": self.best, "since_saved": self.since_saved, "since_best": self.since_best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.saved, self.best = state.get("saved"), state.get("best")
        self.since_saved, self.since_best = int(state.get("since_saved", 0)), int(state.get("since_best", 0))
