"""What one ONNX export is asked to do, and what its stages made.

The pipeline (``fwk/export/pipeline.py``) fills a ``Built`` as the stages run, and the report
(``fwk/export/report.py``) reads both, so neither passes a dozen loose values to the other.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fwk.config.export_schema import ExportConfig
from fwk.export.settings import PrunePlan


@dataclass
class Job:
    """One export's settings, its folders, and the seconds each stage took."""

    source: Any  # fwk.export.source.Source: the run, its checkpoint's model and its data
    eid: str
    plan: PrunePlan
    quantize: str
    cfg: ExportConfig
    max_drop: float
    out: Path  # the temp folder the stages write into
    log: Path  # the exporter's own output
    qat_steps: int | str = 0
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def task(self) -> str:
        return self.source.data.task

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the block as stage ``name``. The report lists the seconds."""
        t0 = time.perf_counter()
        yield
        self.seconds[name] = round(time.perf_counter() - t0, 3)


@dataclass
class Built:
    """What the stages made: models, files, notes, and the quality measured of each."""

    model: Any  # the torch model that was exported: the pruned one, when pruned
    pruned: Any  # fwk.export.prune's result, or None
    folded: Any  # fwk.export.fold's result
    exported: Any  # fwk.export.to_onnx's result
    optimized: Any  # fwk.export.optimize's result
    fp32_path: Path
    final_path: Path
    cpu: dict[str, Any]
    reduce: bool
    notes: list[str] = field(default_factory=list)
    qualities: dict[str, Any] = field(default_factory=dict)
    reference: str = ""  # the stage output differences are measured against
    qat_path: Path | None = None
    qat_report: dict[str, Any] | None = None
