"""A metric target, such as ``val_acc>=0.985`` or ``val_loss<=1.7``.

It is what ``train.stop_at`` ends a run at, and what ``checkpoint.best`` ranks by. It is
torch-free, since validating a config parses it."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

EVAL_METRICS = {"val_loss": "min", "val_ppl": "min", "val_acc": "max"}  # what fwk's evaluation reports
# the values each can take: a cross-entropy is >= 0, its exp >= 1, an accuracy a share
RANGES = {"val_loss": (0.0, math.inf), "val_ppl": (1.0, math.inf), "val_acc": (0.0, 1.0)}
_TARGET = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(>=|<=)\s*([-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?)\s*$")


@dataclass(frozen=True)
class Target:
    metric: str
    op: str  # ">=" or "<="
    value: float

    def reached(self, row: dict[str, Any]) -> bool:
        got = row.get(self.metric)
        if not isinstance(got, int | float) or not math.isfinite(got):
            return False
        return got >= self.value if self.op == ">=" else got <= self.value

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"

    def unreachable(self) -> str | None:
        """Return why no evaluation can reach this target, and what would work, or None when one can.

        No evaluation can reach it when its value lies beyond the metric's range on the
        improving side."""
        low, high = RANGES[self.metric]
        if (self.value > high) if self.op == ">=" else (self.value < low):
            span = f"[{low:g}, {high:g}]" if math.isfinite(high) else f"[{low:g}, inf)"
            return f"can never be reached: {self.metric} lies in {span}; use a value in that range"
        return None


def parse_target(text: str) -> Target:
    """Parse ``METRIC>=VALUE`` or ``METRIC<=VALUE`` on one of the evaluation's metrics.

    The ValueError's text says what is allowed. It follows "expected" in validation's line."""
    found = _TARGET.match(text)
    if not found:
        raise ValueError("METRIC>=VALUE or METRIC<=VALUE, e.g. val_acc>=0.985 or val_loss<=1.7")
    metric, op, value = found.group(1), found.group(2), float(found.group(3))
    if metric not in EVAL_METRICS:
        raise ValueError(f"a metric of fwk's evaluation ({', '.join(EVAL_METRICS)}), not {metric}")
    better = ">=" if EVAL_METRICS[metric] == "max" else "<="
    if op != better:
        raise ValueError(f"{metric}{better}{value:g}: {metric} improves {'upwards' if better == '>=' else 'downwards'}")
    return Target(metric, op, value)
