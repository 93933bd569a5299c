"""Find a run dir by id, unique id prefix, or "the newest complete run", under a runs root.

Commands that read a finished run (`fwk export`, later `fwk runs show`) take a run id the
way git takes a commit: in full, or any prefix that only one run has.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from fwk.errors import UserError
from fwk.track.store import RunDir


def runs_root() -> Path:
    """Return where runs live: $FWK_RUNS, else ./runs, the default of ``paths.runs``."""
    return Path(os.environ.get("FWK_RUNS") or "runs")


def all_runs(root: Path) -> list[RunDir]:
    """List every run dir under ``root``, a folder holding config.yaml, sorted by id."""
    if not root.is_dir():
        return []
    return sorted((RunDir(p) for p in root.iterdir() if (p / "config.yaml").is_file()), key=lambda r: r.id)


def is_complete(run: RunDir) -> bool:
    return run.summary.is_file()


def closest(query: str, ids: list[str], n: int = 3) -> list[str]:
    """Return the ids most like ``query``, comparing a mistyped or truncated id with each id's start."""
    ranked = sorted(ids, key=lambda i: -difflib.SequenceMatcher(None, query, i[: max(len(query), 1)]).ratio())
    return ranked[:n]


def find_run(root: Path, query: str | None) -> RunDir:
    """Find the run ``query`` names by id or unique prefix, or the newest complete run when it
    is None."""
    runs = all_runs(root)
    if query is None:
        done = [r for r in runs if is_complete(r)]
        if not done:
            where = f"{root} has no runs" if not runs else f"none of the {len(runs)} runs under {root} is complete"
            raise UserError(f"no complete run to export: {where}; train one with `fwk train` (or set FWK_RUNS)")
        return max(done, key=lambda r: r.summary.stat().st_mtime)
    matches = [r for r in runs if r.id == query] or [r for r in runs if r.id.startswith(query)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        names = ", ".join(r.id for r in matches[:5]) + (", ..." if len(matches) > 5 else "")
        raise UserError(f"run id prefix '{query}' matches {len(matches)} runs ({names}); give more characters")
    if not runs:
        raise UserError(f"no run '{query}': {root} has no runs (set FWK_RUNS to the runs root you trained into)")
    near = ", ".join(closest(query, [r.id for r in runs]))
    raise UserError(f"no run '{query}' under {root}; closest ids: {near}")
