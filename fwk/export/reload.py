"""``python -m fwk.export.reload FORMAT FILE INPUTS OUTPUTS``: load a ``pt2``, ``aoti`` or
``pte`` export as its users do, with torch alone (ExecuTorch's runtime for ``pte``), run it on
the tensor saved in INPUTS, or on each of a list of them, and save what it returns to
OUTPUTS. ``fwk export`` runs it in a fresh process to verify an export; it imports nothing of
fwk's models."""

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
    if fmt == "tensorrt":  # the engines run on the GPU: inputs go there, outputs come back
        import torch_tensorrt  # noqa: F401 - registers the TensorRT runtime ops the program calls

        module = torch.export.load(str(path)).module()
        return lambda x: module(x.cuda()).cpu()
    if fmt == "pte":
        from fwk.export.edge import loader as executorch_loader  # ExecuTorch's runtime: no fwk model code

        return executorch_loader(path)
    raise SystemExit(f"fwk.export.reload: format {fmt!r} is not pt2, aoti, pte or tensorrt")


def main(argv: list[str]) -> None:
    import torch

    fmt, path, inputs, outputs = argv
    run = loader(fmt, Path(path))
    x = torch.load(inputs, weights_only=True)  # a batch, or a list of batches
    with torch.no_grad():
        torch.save([run(b) for b in x] if isinstance(x, list) else run(x), outputs)


if __name__ == "__main__":
    main(sys.argv[1:])
