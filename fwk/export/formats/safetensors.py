"""``--format safetensors``: write ``model.safetensors``, the raw weights of any fwk model,
reloaded into a fresh model.

The file keeps the state_dict names, stores tied tensors once, and has the run id and step in
its metadata."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fwk.export.formats import FORMATS, Format


@dataclass(frozen=True)
class Safetensors(Format):
    name: str = "safetensors"

    def writes(self) -> tuple[str, ...]:
        return ("*.safetensors",)

    def write(self, source: Any, out: Path, log: Path) -> tuple[Any, list[str]]:
        from safetensors.torch import load_model, save_model

        from fwk.models.build import build_model

        meta = {"fwk_run": source.run.id, "step": str(source.step), "model": type(source.model).__name__}
        save_model(source.model, str(out / "model.safetensors"), metadata=meta)
        fresh = build_model(source.config.model, source.data, init=False).float().eval()
        missing, unexpected = load_model(fresh, str(out / "model.safetensors"), strict=True)
        assert not missing and not unexpected, (missing, unexpected)
        return fresh, ["model.safetensors"]


FORMATS.register(Safetensors, name="safetensors")(Safetensors)
