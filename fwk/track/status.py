"""What a run dir says about its run, read without torch: status, step, metrics, tags.

The run dirs are the source of truth that the run index (``fwk/track/index.py``) caches:
complete = ``summary.json``; running = its lock is held; failed = the last launch in
``meta.json`` ended in an error (``record_outcome``); otherwise interrupted.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from fwk.track import lease
from fwk.track.store import RunDir, flock_holders

STATUSES = ("running", "complete", "failed", "interrupted")


def lock_holder(run: RunDir) -> bool:
    """Tell whether a launcher holds the run's lock (see RunLock) right now.

    Linux: read /proc/locks, so that asking never takes the lock itself (a `fwk train`
    starting in that instant would otherwise be refused as "already running").
    Elsewhere: a shared non-blocking probe.
    """
    lock = run.path / ".lock"
    if not lock.exists():
        return False
    holders = flock_holders(lock)
    return _probe(lock) if holders is None else bool(holders)


def running(run: RunDir) -> str | None:
    """Return who runs it right now, or None. That is a launcher holding its lock on this
    machine, or the fresh lease of a multi-node launch on any machine (fwk/track/lease.py)."""
    if lock_holder(run):
        return "a launcher on this machine"
    held = lease.fresh(run.path)
    return lease.describe(held) if held is not None else None


def _probe(lock: Path) -> bool:
    with open(lock) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_config(run: RunDir) -> dict[str, Any]:
    try:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C loader: 10x faster on a rebuild
        data = yaml.load(run.config.read_text(), Loader=loader)
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Flatten {"a": {"b": 1}} into {"a.b": 1}. Lists stay values."""
    if not isinstance(tree, dict) or (prefix and not tree):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def last_train(run: RunDir) -> tuple[int | None, float | None]:
    """Return the last logged step and the last train loss from the tail of metrics.jsonl,
    without reading it all."""
    try:
        with open(run.metrics, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None, None
    step = loss = None
    for line in reversed(lines):
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a partial line at the cut, or one being written
        if step is None and isinstance(row.get("step"), int):
            step = row["step"]
        if row.get("kind") == "train" and "loss" in row:
            loss = row["loss"]
            break
    return step, loss


def _parse_time(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except ValueError:
        return None


def derive_status(run: RunDir, meta: dict[str, Any] | None = None) -> str:
    """Derive the run's status. It is complete with a summary.json, and running when a launcher
    holds the lock or a multi-node launch its lease. It is failed when the launcher recorded a
    failed launch last in meta.json, and interrupted in any other case: stopped or killed."""
    if run.summary.is_file():
        return "complete"
    if running(run):
        return "running"
    meta = read_json(run.meta) if meta is None else meta
    launches = (meta or {}).get("launches") or [{}]
    if launches[-1].get("outcome") == "failed":
        return "failed"
    return "interrupted"


def row_from_dir(run: RunDir) -> dict[str, Any]:
    """Build the index row the run dir says, read from its files."""
    config = read_config(run)
    meta = read_json(run.meta) or {}
    summary = read_json(run.summary)
    step, loss = last_train(run)
    metrics: dict[str, Any] = {}
    if loss is not None:
        metrics["loss"] = loss
    if summary:
        metrics.update(summary.get("eval") or {})
        step = summary.get("final_step", step)
        target = summary.get("target") or {}
        if target.get("reached"):  # train.stop_at: the training seconds it took, shown by `fwk runs`
            metrics["to_target_s"] = round(float(target["train_time_s"]), 2)
    tags = config.get("tags", [])  # the `tags` field may not be in the schema yet: older configs lack it
    try:
        mtime = run.path.stat().st_mtime
    except OSError:
        mtime = time.time()
    return {
        "id": run.id,
        "recipe": config.get("recipe"),
        "status": derive_status(run, meta),
        "step": step,
        "max_steps": (config.get("train") or {}).get("max_steps"),
        "metrics": metrics,
        "created": _parse_time(meta.get("created")) or mtime,
        "updated": mtime,
        "parent": meta.get("parent"),
        "sweep": meta.get("sweep") or config.get("sweep_id"),
        "tags": [str(t) for t in tags] if isinstance(tags, list) else [],
    }


def record_outcome(run: RunDir, outcome: str, exit_status: int | None) -> None:
    """Note how the latest launch ended in meta.json, so a rebuilt index knows a failure."""
    from fwk.track.store import write_atomic

    meta = read_json(run.meta)
    if not meta or not meta.get("launches"):
        return
    meta["launches"][-1].update(outcome=outcome, exit=exit_status)
    write_atomic(run.meta, json.dumps(meta, indent=2) + "\n")
