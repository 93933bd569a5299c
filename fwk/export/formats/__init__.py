"""Export formats (``fwk export --format NAME``): one file each, found by the registry, which
imports every module of this package. A format module names its format, says whether its
output is a folder and whether it takes the ``export.*`` settings, and writes and reloads the
run's weights. Format modules import torch only inside their functions, so that listing the
names (``--help``, a wrong ``--format``) stays fast. A folder ``X/fwk/export/formats/`` on
``sys.path`` (``PYTHONPATH=X``) adds its files to the package, so a format of your own needs
no change to fwk."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fwk.registry import Registry

FORMATS = Registry("export format", package="fwk.export.formats")
REPORT = "weights_report.json"  # beside a weights export's files, never copied to --output


@dataclass(frozen=True)
class Format:
    """Say what a format writes; ``write`` and ``reload`` are its own, the checks are shared.

    ``folder``: the output is a folder (``--output`` names one); ``settings``: it takes the
    ``export.*`` settings and the pruning and quantization flags; ``how``: how the reloaded
    model was made, for the log line.
    """

    name: str = ""
    folder: bool = False
    settings: bool = False
    how: str = "a fresh model"

    def write(self, source: Any, out: Path) -> tuple[Any, list[str]]:
        """Write the run's model into ``out``; return the model reloaded from it and the files written."""
        raise NotImplementedError(f"--format {self.name} writes through its own pipeline")

    def copy(self, final_dir: Path, output: Path) -> None:
        """Copy the verified export to ``--output``."""
        import shutil

        if self.folder:
            shutil.copytree(final_dir, output, ignore=shutil.ignore_patterns(REPORT))
        else:
            (single,) = [p for p in final_dir.iterdir() if p.name != REPORT]
            shutil.copyfile(single, output)


def names() -> list[str]:
    """Return the format names, onnx first, for ``--help`` and the error naming them."""
    return sorted(FORMATS.names(), key=lambda n: (n != "onnx", n))


def get(name: str) -> Format:
    """Return the format registered as ``name``."""
    return FORMATS.get(name).builder()


def _folders(own: list[str]) -> list[str]:
    """Return this package's folder, then each other ``fwk/export/formats`` folder on ``sys.path``."""
    folders, seen = list(own), {os.path.realpath(f) for f in own}
    for entry in sys.path:
        folder = os.path.join(entry or os.curdir, "fwk", "export", "formats")
        if os.path.isdir(folder) and os.path.realpath(folder) not in seen:
            folders.append(folder)
            seen.add(os.path.realpath(folder))
    return folders


__path__ = _folders(__path__)
