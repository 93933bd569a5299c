"""`fwk replay`: what a replay must match, and how two runs' metrics compare step by step.

Torch-free. A replay re-runs a run's recorded config (``config.yaml``) on the same code and
data; its run id is the original's config hashed with ``replay of <id>``, so it gets its
own run dir and replaying twice finds the first replay. Timings (samples/s, waits) differ
between any two runs and are not compared.
"""

from __future__ import annotations

import math
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fwk
from fwk.errors import UserError
from fwk.track.run_id import _CODE_DIRS
from fwk.track.store import RunDir

# Row keys that measure time, not what was computed: they differ between any two runs.
COMMIT_ID = re.compile(r"[0-9a-f]{4,64}")  # what fwk records after "git:" (run_id.code_version)
TIMING_KEYS = frozenset({"samples_per_s", "data_wait", "comm_wait", "train_s"})


def salt(original: RunDir) -> str:
    return f"replay of {original.id}"


def _rows(run: RunDir) -> dict[tuple[str, int], dict[str, float]]:
    """Map each (kind, step) to the numeric values of that metrics.jsonl row, timings left out."""
    out: dict[tuple[str, int], dict[str, float]] = {}
    for row in run.metrics_rows():
        values = {
            k: float(v)
            for k, v in row.items()
            if k not in ("step", "kind") and k not in TIMING_KEYS and isinstance(v, int | float)
        }
        out[(str(row.get("kind", "train")), int(row["step"]))] = values
    return out


@dataclass
class Difference:
    kind: str
    step: int
    key: str
    a: float
    b: float

    @property
    def relative(self) -> float:
        """Return |a - b| relative to max(1, |a|, |b|). It is inf when exactly one side is not finite."""
        if math.isnan(self.a) and math.isnan(self.b):
            return 0.0
        if not (math.isfinite(self.a) and math.isfinite(self.b)):
            return 0.0 if self.a == self.b else math.inf
        return abs(self.a - self.b) / max(1.0, abs(self.a), abs(self.b))


@dataclass
class Comparison:
    """Two runs' metrics, row by row on the (kind, step) rows both logged."""

    rows: int = 0
    values: int = 0
    differing: int = 0
    largest: Difference | None = None
    only_a: list[tuple[str, int]] = field(default_factory=list)
    only_b: list[tuple[str, int]] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        """Tell whether every value of every row the original logged is equal in the replay. A
        replay of an unfinished run logs more rows, and those are not compared."""
        return self.rows > 0 and self.differing == 0 and not self.only_a

    def within(self, tolerance: float) -> bool:
        return self.rows > 0 and not self.only_a and (self.largest is None or self.largest.relative <= tolerance)


def _pairs(a: dict[str, float], b: dict[str, float]) -> Iterator[tuple[str, float, float]]:
    for key in sorted(set(a) | set(b)):
        yield key, a.get(key, math.nan), b.get(key, math.nan)


def compare(a: RunDir, b: RunDir) -> Comparison:
    rows_a, rows_b = _rows(a), _rows(b)
    out = Comparison(only_a=sorted(set(rows_a) - set(rows_b)), only_b=sorted(set(rows_b) - set(rows_a)))
    for kind, step in sorted(set(rows_a) & set(rows_b), key=lambda r: (r[1], r[0])):
        out.rows += 1
        for key, va, vb in _pairs(rows_a[(kind, step)], rows_b[(kind, step)]):
            out.values += 1
            same = va == vb or (math.isnan(va) and math.isnan(vb))
            if same:
                continue
            out.differing += 1
            diff = Difference(kind, step, key, va, vb)
            if out.largest is None or diff.relative > out.largest.relative:
                out.largest = diff
    return out


def _commit(code: str) -> str | None:
    """Return the commit of a code version `git:<commit>[+dirty.<hash>]`, else None. None is
    also the answer when what meta.json holds there is not a hex commit id, since the file is
    text anyone may have edited."""
    if not code.startswith("git:"):
        return None
    commit = code[4:].split("+", 1)[0]
    return commit if COMMIT_ID.fullmatch(commit) else None


def check_code(recorded: str, current: str, force: bool) -> list[str]:
    """Return lines to print about the code. Raise a UserError when it differs and ``force`` is
    not set."""
    if recorded == current:
        return []
    commit = _commit(recorded)
    if not force:
        how = f"check out {commit} (git checkout {commit}) to replay it exactly, " if commit else ""
        if "+dirty." in recorded:  # its uncommitted changes are known by hash only
            how = f"the run had uncommitted changes on {commit} (not kept, commit before training to replay), "
        raise UserError(
            f"the run was trained on code {recorded} and this checkout is {current}; {how}"
            "or pass --force to replay it on this code"
        )
    lines = [f"replaying on other code (--force): run trained on {recorded}, this checkout is {current}"]
    if recorded.startswith("git:"):
        lines += code_diff(recorded[4:].split("+", 1)[0])  # which says so when it is not a commit id
    if "+dirty." in recorded:
        lines.append("the run's uncommitted changes were not recorded, only their hash: they are not in this diff")
    return lines


def code_diff(commit: str) -> list[str]:
    """Return the `git diff --stat` of the code folders from ``commit``, a hex id, to this work tree."""
    if not COMMIT_ID.fullmatch(commit):  # never an option, a range or a ref: git would read it as one
        return [f"code diff unavailable: {commit[:40]!r} is not a commit id (4 to 64 hex digits)"]
    repo = Path(fwk.__file__).resolve().parents[1]
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "diff", "--stat", "--end-of-options", commit, "--", *_CODE_DIRS],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return [f"code diff unavailable: {exc}"]
    if out.returncode != 0:
        return [f"code diff unavailable: commit {commit} is not in this repository ({out.stderr.strip()[:100]})"]
    lines = out.stdout.rstrip().splitlines()
    if not lines:
        return [f"no code changes in {', '.join(_CODE_DIRS)} since {commit}"]
    return [f"code changes since {commit}:", *lines]


def check_data(recorded: dict[str, Any] | None, current: dict[str, str], force: bool) -> list[str]:
    """Return lines to print about the data. Raise a UserError when its fingerprint changed and
    ``force`` is not set."""
    if not recorded or recorded.get("digest", "") == current["digest"]:
        return []
    message = (
        f"the run's data changed since it was trained: recorded {recorded.get('digest') or '-'} "
        f"({recorded.get('what')}), now {current['digest'] or '-'} ({current['what']})"
    )
    if not force:
        raise UserError(f"{message}; restore that data, or pass --force to replay on this data")
    return [f"replaying on other data (--force): {message}"]


def recorded_decisions(summary: dict[str, Any] | None, env: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Return a run's measured decisions, to re-apply. They are summary.json's when it
    finished, else those its launches recorded in env.json, a later launch's over an earlier
    one's."""
    if summary and isinstance(summary.get("decisions"), dict):
        return summary["decisions"]
    out: dict[str, dict[str, Any]] = {}
    for launch in (env or {}).get("launches", []):
        out.update(launch.get("decisions") or {})
    return out
