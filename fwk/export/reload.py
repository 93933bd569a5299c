"""``python -m fwk.export.reload FORMAT FILE INPUTS OUTPUTS``: load a ``pt2`` or ``aoti`` export
as its users do, with torch alone, run it on the tensor saved in INPUTS and save what it
returns to OUTPUTS. ``fwk export`` runs it in a fresh process to verify an export; it imports
nothing of fwk's models."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def loader(fmt: str, path: Path) -> Callable[[Any], Any]:
    """Return a callable running the export at ``path`` (format ``fmt``)."""
    import torch

    if fmt == "pt2":
        return torch.export.load(str(path)).module()
    if fmt == "aoti":
        return torch._inductor.aoti_load_package(str(path))
    raise SystemExit(f"fwk.export.reload: format {fmt!r} is not pt2 or aoti")


def main(argv: list[str]) -> None:
    import torch

    fmt, path, inputs, outputs = argv
    run = loader(fmt, Path(path))
    x = torch.load(inputs, weights_only=True)
    with torch.no_grad():
        torch.save(run(x), outputs)


if __name__ == "__main__":
    main(sys.argv[1:])
