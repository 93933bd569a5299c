"""Sweep records: ``<runs root>/sweeps/<sweep id>.json``, and the best run of a sweep.

A sweep id is content-addressed like a run id: a hash of its member run ids, so the same
sweep command on the same code finds the same sweep (and each member, an ordinary run,
resumes or says it is complete). The record lists the command's overrides, the swept keys
and every member with its own overrides and swept values. It is the sweep's membership:
a member that existed before the sweep keeps the lineage of its first launch in meta.json,
but is still listed here. `sweeps/` holds no config.yaml, so it is never taken for a run dir.
Imports no torch.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any

from fwk.errors import UserError
from fwk.track.status import read_json
from fwk.track.store import write_atomic

SWEEPS_DIR = "sweeps"
# The metric that ranks a sweep's runs, first present wins: (metric, "max" or "min").
# "loss" is the last logged train loss (the index's metrics); the others come from summary.json.
PRIMARY = (("val_acc", "max"), ("val_loss", "min"), ("val_ppl", "min"), ("loss", "min"))


def sweep_id(run_ids: list[str]) -> str:
    """Hash the sorted member run ids into 10 hex digits."""
    return hashlib.sha256("\n".join(sorted(run_ids)).encode()).hexdigest()[:10]


def sweep_path(root: Path, sid: str) -> Path:
    return Path(root) / SWEEPS_DIR / f"{sid}.json"


def write_sweep(root: Path, record: dict[str, Any]) -> Path:
    """Write a sweep's record atomically, or rewrite it. A rewrite keeps the first ``created``."""
    path = sweep_path(root, record["sweep_id"])
    path.parent.mkdir(parents=True, exist_ok=True)
    old = read_json(path) or {}
    record = {**record, "created": old.get("created") or time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    write_atomic(path, json.dumps(record, indent=2) + "\n")
    return path


def find_sweep(root: Path, query: str) -> dict[str, Any] | None:
    """Return the record of the sweep ``query`` names by id or unique prefix, or None if none does."""
    folder = Path(root) / SWEEPS_DIR
    ids = sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []
    matches = [i for i in ids if i == query] or [i for i in ids if i.startswith(query)]
    if len(matches) > 1:
        raise UserError(
            f"sweep id prefix '{query}' matches {len(matches)} sweeps ({', '.join(matches[:5])}); give more characters"
        )
    if not matches:
        return None
    record = read_json(sweep_path(root, matches[0]))
    if record is None:
        raise UserError(f"{sweep_path(root, matches[0])} is not valid JSON; run the sweep command again to rewrite it")
    return record


def primary_metric(rows: list[dict[str, Any]]) -> tuple[str, str] | None:
    """Return the metric that ranks these runs and its mode, "max" or "min": the first of
    PRIMARY that a complete run has."""
    for name, mode in PRIMARY:
        if _scored(rows, name):
            return name, mode
    return None


def _scored(rows: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """Return the complete runs with a finite value of ``name``, since a NaN would rank at random."""
    return [
        r
        for r in rows
        if r["status"] == "complete"
        and isinstance(r["metrics"].get(name), int | float)
        and math.isfinite(r["metrics"][name])
    ]


def tie_breaker(name: str) -> str | None:
    """Return the metric that ranks runs equal on ``name``, the next of PRIMARY, or None."""
    names = [n for n, _ in PRIMARY]
    rest = names[names.index(name) + 1 :] if name in names else []
    return rest[0] if rest else None


def best_run(rows: list[dict[str, Any]]) -> tuple[str | None, tuple[str, str] | None]:
    """Return the id of the best complete run and the metric and mode that ranked it. Return
    (None, None) when no run has finished."""
    metric = primary_metric(rows)
    if metric is None:
        return None, None
    name, _ = metric
    ranking = PRIMARY[[n for n, _ in PRIMARY].index(name) :]  # ties go to the next metric (val_loss)

    def key(r: dict[str, Any]) -> tuple[float, ...]:
        values = []
        for n, m in ranking:
            v = r["metrics"].get(n)
            ok = isinstance(v, int | float) and math.isfinite(v)
            values.append((-v if m == "max" else v) if ok else math.inf)
        return tuple(values)

    return min(_scored(rows, name), key=key)["id"], metric


def sweep_rows(
    record: dict[str, Any], rows: list[dict[str, Any]], pending: bool = True
) -> tuple[list[dict[str, Any]], tuple[str, str] | None]:
    """Return the sweep's runs among index ``rows`` in the order of its combinations, each with
    its swept values and a ``best`` flag. Then return the metric and mode that picked the best.

    Members are the runs the record lists, plus any whose meta.json names this sweep. With
    ``pending``, a listed member that has no run dir yet is a row of status "pending".
    """
    by_id = {r["id"]: r for r in rows}
    values = {m["run_id"]: m.get("values") or {} for m in record["members"]}
    ids = [*values, *(r["id"] for r in rows if r.get("sweep") == record["sweep_id"] and r["id"] not in values)]
    out = [
        {**by_id[i], "swept": values.get(i, {})} if i in by_id else _pending(i, values[i])
        for i in ids
        if i in by_id or pending
    ]
    best, metric = best_run(out)
    for r in out:
        r["best"] = r["id"] == best
    return out, metric


def _pending(run_id: str, values: dict[str, Any]) -> dict[str, Any]:
    """Build the row of a member that has not started and has no run dir yet, shaped like an
    index row."""
    empty = dict.fromkeys(("recipe", "step", "max_steps", "created", "updated", "parent", "sweep"))
    return {**empty, "id": run_id, "status": "pending", "metrics": {}, "tags": [], "swept": values}
