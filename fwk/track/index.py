"""The run index: ``<runs root>/index.sqlite``, one row per run dir, for fast listing.

The run dirs stay the source of truth. The index is a cache of what they say (recipe,
status, step, key metrics, tags, lineage), written by the launcher as runs start and end;
a missing, corrupt or outdated index is rebuilt from the run dirs with one line saying so.
Several `fwk train` write at once: WAL journal, a busy timeout, one short transaction per
write. Imports no torch: `fwk runs` answers in well under a second.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fwk.track.status import last_train, row_from_dir, running
from fwk.track.store import RunDir

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1  # PRAGMA user_version; another number means "rebuild from the run dirs"
INDEX_NAME = "index.sqlite"
BUSY_TIMEOUT_MS = 30_000  # a writer waits this long for another's transaction (they last milliseconds)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    recipe TEXT,
    status TEXT NOT NULL,
    step INTEGER,
    max_steps INTEGER,
    metrics TEXT NOT NULL DEFAULT '{}',  -- JSON: summary eval metrics + last train loss
    created REAL,                        -- unix time of the first launch
    updated REAL,                        -- unix time of the last write
    parent TEXT,                         -- the run this one derives from (a replay; resumes are the same run)
    sweep TEXT,                          -- the sweep that launched it
    tags TEXT NOT NULL DEFAULT '[]'      -- JSON list of config.yaml's top-level tags
);
CREATE INDEX IF NOT EXISTS runs_created ON runs (created);
"""
_COLUMNS = ("id", "recipe", "status", "step", "max_steps", "metrics", "created", "updated", "parent", "sweep", "tags")


def index_path(root: Path) -> Path:
    return Path(root) / INDEX_NAME


# ---- what a run dir says (the truth) ----


# ---- the index file ----


def _connect(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    con.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    con.row_factory = sqlite3.Row
    return con


def _usable(con: sqlite3.Connection) -> str | None:
    """Return None when the index is one we can use, and else why not, to say so and then rebuild it."""
    try:
        version = con.execute("PRAGMA user_version").fetchone()[0]
        if version == 0 and not con.execute("SELECT 1 FROM sqlite_master WHERE name = 'runs'").fetchone():
            return "missing"
        if version != SCHEMA_VERSION:
            return f"of schema version {version}, expected {SCHEMA_VERSION}"
        con.execute("SELECT id FROM runs LIMIT 1").fetchall()
    except sqlite3.DatabaseError as exc:
        return f"corrupt ({exc})"
    return None


@contextlib.contextmanager
def _rebuild_lock(root: Path) -> Iterator[None]:
    """Let one process at a time replace a bad index, since two would delete each other's new one."""
    # on the runs root folder itself: no lock file beside the run dirs
    fd = os.open(root, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _run_dirs(root: Path) -> dict[str, RunDir]:
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return {}
    return {e.name: RunDir(Path(e.path)) for e in entries if e.is_dir() and os.path.isfile(Path(e.path, "config.yaml"))}


def _upsert(con: sqlite3.Connection, row: dict[str, Any]) -> None:
    values = {k: row.get(k) for k in _COLUMNS}
    values["metrics"] = json.dumps(values["metrics"] or {})
    values["tags"] = json.dumps(values["tags"] or [])
    values["updated"] = values["updated"] or time.time()
    # created stays the first launch's time; the other columns take the newest word
    con.execute(
        f"INSERT INTO runs ({', '.join(_COLUMNS)}) VALUES ({', '.join(':' + c for c in _COLUMNS)}) "
        "ON CONFLICT(id) DO UPDATE SET "
        + ", ".join(f"{c} = excluded.{c}" for c in _COLUMNS if c not in ("id", "created"))
        + ", created = COALESCE(runs.created, excluded.created)",
        values,
    )


def _rebuild(con: sqlite3.Connection, root: Path, runs: dict[str, RunDir]) -> None:
    con.execute("BEGIN IMMEDIATE")
    try:
        con.execute("DELETE FROM runs")
        for run in runs.values():
            _upsert(con, row_from_dir(run))
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def open_index(root: Path, quiet_for: str | None = None) -> sqlite3.Connection:
    """Open (creating or rebuilding as needed) the index of the runs under ``root``.

    A rebuild says so in one line, unless the index was merely missing and the only run dir
    is ``quiet_for`` (the first run under a new root is no news).
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    path = index_path(root)
    con = _connect(path)
    why = _usable(con)
    if why is None:
        return con
    con.close()
    with _rebuild_lock(root):
        con = _connect(path)
        why = _usable(con)  # another process may have rebuilt it while we waited
        if why is None:
            return con
        if why != "missing":
            con.close()
            for suffix in ("", "-wal", "-shm", "-journal"):  # a stale WAL would be replayed into the new file
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"{path}{suffix}")
            con = _connect(path)
        con.execute("PRAGMA journal_mode = WAL")  # readers never block the writer, nor it them
        con.executescript(_SCHEMA)
        runs = _run_dirs(root)
        _rebuild(con, root, runs)
        con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    if why != "missing" or set(runs) - {quiet_for}:
        logger.warning(f"fwk: run index {path} was {why}; rebuilt it from {len(runs)} run dirs")
    return con


def _decode(row: sqlite3.Row) -> dict[str, Any]:
    out = dict(row)
    out["metrics"] = json.loads(out["metrics"] or "{}")
    out["tags"] = json.loads(out["tags"] or "[]")
    return out


# ---- writes (the launcher) and reads (`fwk runs`) ----


def record(run: RunDir, status: str | None = None, **fields: Any) -> None:
    """Upsert the run's row from its dir. ``status`` overrides what the dir says, since the
    launcher knows "running" and "failed" before the files can show it."""
    row = row_from_dir(run)
    if status is not None:
        row["status"] = status
    row.update(fields, updated=time.time())
    con = open_index(run.path.parent, quiet_for=run.id)
    try:
        _upsert(con, row)
    finally:
        con.close()


def record_quietly(run: RunDir, status: str | None = None, **fields: Any) -> None:
    """record(), for the launcher: an index error is one warning line, never a failed run."""
    try:
        record(run, status, **fields)
    except Exception as exc:  # noqa: BLE001 - the index is a cache; training goes on without it
        logger.warning(f"fwk: warning: run index not updated for {run.id} ({type(exc).__name__}: {exc})")


def forget(root: Path, run_id: str) -> None:
    con = open_index(root)
    try:
        con.execute("DELETE FROM runs WHERE id = ?", (run_id,))
    finally:
        con.close()


def query(
    root: Path,
    recipe: str | None = None,
    status: str | None = None,
    tags: list[str] | None = None,
    sweep: str | None = None,
) -> list[dict[str, Any]]:
    """Return the runs under ``root`` matching every filter given, newest first.

    The index is first squared with the run dirs: dirs it lacks are added, rows whose dir
    is gone are dropped, and rows that say "running" are checked against the lock (a
    killed launcher never wrote its ending).
    """
    root = Path(root)
    if not root.is_dir():
        return []
    con = open_index(root)
    try:
        dirs = _run_dirs(root)
        rows = {r["id"]: _decode(r) for r in con.execute("SELECT * FROM runs")}
        stale = [i for i in rows if i not in dirs]
        fresh = [row_from_dir(dirs[i]) for i in dirs if i not in rows]
        for r in rows.values():
            run = dirs.get(r["id"])
            if run is None or r["status"] == "complete":
                continue
            if run.summary.is_file():  # finished, though its launcher's last word was lost
                fresh.append(row_from_dir(run))
            elif r["status"] == "running":
                if not running(run):  # its launcher is gone (a lock on this machine, a lease on many)
                    fresh.append(row_from_dir(run))
                else:
                    r["step"] = last_train(run)[0] or r["step"]  # live progress, not written to the index
        if stale or fresh:
            con.execute("BEGIN IMMEDIATE")
            for i in stale:
                con.execute("DELETE FROM runs WHERE id = ?", (i,))
                rows.pop(i)
            for r in fresh:
                _upsert(con, r)
                rows[r["id"]] = r
            con.execute("COMMIT")
    finally:
        con.close()
    out = [
        r
        for r in rows.values()
        if (recipe is None or r["recipe"] == recipe)
        and (status is None or r["status"] == status)
        and (sweep is None or r["sweep"] == sweep)
        and all(t in r["tags"] for t in tags or [])
    ]
    return sorted(out, key=lambda r: (r["created"] or 0, r["id"]), reverse=True)
