"""``--format pt2``: the folded eval-mode model as a ``torch.export`` program (``model.pt2``,
``torch.export.save``), its batch axis dynamic (and its sequence axis, for language models).
``torch.export.load(path).module()`` runs it without the model's Python code."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fwk.export.formats import FORMATS
from fwk.export.program import Program


@dataclass(frozen=True)
class Pt2(Program):
    name: str = "pt2"
    file: str = "model.pt2"
    runtime: str = "torch.export"

    def save(self, program: Any, out: Path, log: Path) -> None:
        import torch

        torch.export.save(program, str(out / self.file))


FORMATS.register(Pt2, name="pt2")(Pt2)
