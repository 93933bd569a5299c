"""``fwk export RUN --format npz``: the run's state_dict as numpy arrays in one ``model.npz``.

Drop this file into a folder ``X/fwk/export/formats/`` and run fwk with ``PYTHONPATH=X``:
the formats package finds it there. fwk then reloads the arrays into a fresh model, runs it
on held-out validation inputs and compares its outputs with the checkpoint's model, as it
does for safetensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fwk.export.formats import FORMATS, Format


@dataclass(frozen=True)
class Npz(Format):
    name: str = "npz"

    def write(self, source: Any, out: Path, log: Path) -> tuple[Any, list[str]]:
        import numpy as np
        import torch

        from fwk.models.build import build_model

        arrays = {k: v.detach().cpu().numpy() for k, v in source.model.state_dict().items()}
        np.savez(out / "model.npz", **arrays)
        fresh = build_model(source.config.model, source.data, init=False).float().eval()
        with np.load(out / "model.npz") as saved:
            fresh.load_state_dict({k: torch.from_numpy(saved[k]) for k in saved.files}, strict=True)
        return fresh, ["model.npz"]


FORMATS.register(Npz, name="npz")(Npz)
