"""Export formats for ``fwk export --format NAME``, one file each.

The registry finds them and imports every module of this package. A format module names its
format, says whether its output is a folder, and runs its export. ``onnx`` runs through the
pruning, quantizing and verifying pipeline, and ``pte`` through ExecuTorch's, which shares its
pruning. The others (``Format``) write the run's weights, which fwk reloads and compares with
the checkpoint's model. Format modules import torch only
inside their functions, so that listing the names stays fast, for ``--help`` or a wrong
``--format``. A folder ``X/fwk/export/formats/`` on ``sys.path`` (``PYTHONPATH=X``) adds its
files to the package, so a format of your own needs no change to fwk."""

from __future__ import annotations

import logging
import os
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fwk.registry import Registry

FORMATS = Registry("export format", package="fwk.export.formats")


@dataclass(frozen=True)
class Request:
    """What ``fwk export`` was asked, held once the run ids and the words are checked."""

    ids: list[str]  # the run id, or none for the newest complete run
    words: list[str]  # the overrides: export.KEY=VALUE and paths.runs=DIR
    output: Path | None
    overwrite: bool
    prune: str = "none"
    ratio: float = 0.5
    rounds: int | None = None
    quantize: str | None = None  # None: the flag was not given
    max_accuracy_drop: float = 1.0
    qat_steps: str = "0"
    exits: bool = True  # --no-exits: False (a run trained with methods=[early_exit] exports its plain model)

    def run(self) -> Any:
        """Find the run to export: the id given under paths.runs, or the newest complete one."""
        from fwk.track.lookup import find_run, runs_root

        roots = [w.partition("=")[2] for w in self.words if w.startswith("paths.runs=")]
        return find_run(Path(roots[-1]) if roots else runs_root(), self.ids[0] if self.ids else None)

    def overrides(self) -> list[str]:
        """Return the export.* overrides, without paths.runs."""
        return [w for w in self.words if "=" in w and not w.startswith("paths.runs=")]


@dataclass(frozen=True)
class Backend(ABC):
    """What ``fwk export --format NAME`` does. ``folder`` says that ``--output`` names a folder."""

    name: str = ""
    folder: bool = False
    carries_exits: bool = False  # it exports a run's exit heads and threshold (fwk.export.exits)

    @abstractmethod
    def export(self, request: Request) -> None:
        """Export the run ``request`` names, verified, and copy it to ``--output`` when given."""

    def writes(self) -> tuple[str, ...]:
        """Return the name patterns of what an export of this format is at ``--output``, the only
        thing ``--overwrite`` replaces there (``fwk.export.replace``); none by default."""
        return ()


@dataclass(frozen=True)
class Format(Backend):
    """A format that writes the trained model as it is, with no settings of its own.

    A format of this kind only writes and reloads. fwk checks the flags, runs the reloaded
    model on held-out inputs against the checkpoint's, and keeps the report. ``how`` says how the
    reloaded model was made, for the log line.
    """

    how: str = "a fresh model"
    tolerance: float = 1e-4  # max abs difference of the outputs, fp32 on both sides: the same weights, the same math

    @abstractmethod
    def write(self, source: Any, out: Path, log: Path) -> tuple[Any, list[str]]:
        """Write the run's model into ``out``, and return the model reloaded from it and the
        files written. ``log`` takes an exporter's own output, for the formats that have one."""

    def details(self, source: Any) -> dict[str, Any]:
        """Return what the report should hold beyond the files and the check: none by default."""
        return {}

    def outputs(self, reloaded: Any, inputs: list[Any]) -> list[Any]:
        """Return the reloaded model's output for each batch of ``inputs``."""
        return [reloaded(x) for x in inputs]

    def without(self, request: Request) -> str:
        """What exports the plain model of a run with exits, for the line that says so."""
        return "--no-exits" if self.carries_exits and not request.exits else f"--format {self.name}"

    def export(self, request: Request) -> None:
        from fwk.errors import UserError
        from fwk.export.pipeline import check_output
        from fwk.export.weights import run_weights_export

        r = request
        onnx_only = [o for o, on in (("--prune", r.prune != "none"), ("--quantize", r.quantize is not None)) if on]
        onnx_only += ["--qat-steps"] if r.qat_steps != "0" else []
        if onnx_only:
            raise UserError(
                f"{onnx_only[0]} applies to --format onnx; --format {self.name} exports the trained model as it is"
            )
        if r.overrides():
            raise UserError(
                f"{r.overrides()[0]}: export.* settings apply to --format onnx; --format {self.name} takes none"
            )
        check_output(r.output, r.overwrite, self.writes(), self.folder)
        run = r.run()
        logging.getLogger("transformers").setLevel(logging.ERROR)
        run_weights_export(run, self, r.output, r.overwrite, self.carries_exits and r.exits, self.without(r))

    def copy(self, final_dir: Path, output: Path) -> None:
        """Copy the verified export to ``--output``."""
        import shutil

        from fwk.export.weights import LOG, REPORT

        # output does not exist: it is fwk.export.replace's temporary sibling

        if self.folder:
            shutil.copytree(final_dir, output, ignore=shutil.ignore_patterns(REPORT, LOG))
        else:
            (single,) = [p for p in final_dir.iterdir() if p.name not in (REPORT, LOG)]
            shutil.copyfile(single, output)


def names() -> list[str]:
    """Return the format names, onnx first, for ``--help`` and the error naming them."""
    return sorted(FORMATS.names(), key=lambda n: (n != "onnx", n))


def get(name: str) -> Backend:
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
