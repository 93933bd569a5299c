"""Lineage: which run a run comes from, and which runs come from it. Torch-free.

A run's meta.json names its origin in ``parent`` and ``kind``, set when `fwk replay` or a sweep
created it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fwk.track.status import read_json
from fwk.track.store import RunDir


def origin(run: RunDir) -> tuple[str | None, str | None]:
    """Return a run's parent id and kind, from its meta.json."""
    meta = read_json(run.meta) or {}
    return meta.get("parent"), meta.get("kind")


def ancestors(run: RunDir) -> list[dict[str, Any]]:
    """Return the chain from the oldest ancestor down to ``run`` as [{id, kind, present}],
    oldest first. A parent whose run dir was removed ends the chain, with ``present`` False."""
    chain = [{"id": run.id, "kind": origin(run)[1], "present": True}]
    seen = {run.id}
    parent, _ = origin(run)
    while parent and parent not in seen:
        seen.add(parent)
        up = RunDir(run.path.parent / parent)
        if not up.meta.is_file():
            chain.append({"id": parent, "kind": None, "present": False})
            break
        chain.append({"id": parent, "kind": origin(up)[1], "present": True})
        parent = origin(up)[0]
    return chain[::-1]


def children(root: Path, rows: list[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    """List the runs whose parent is ``run_id``, from index rows, with their kind, oldest first."""
    out = []
    for row in sorted(rows, key=lambda r: (r.get("created") or 0, r["id"])):
        if row.get("parent") == run_id:
            out.append({"id": row["id"], "kind": origin(RunDir(Path(root) / row["id"]))[1], "status": row["status"]})
    return out


def chain_text(chain: list[dict[str, Any]]) -> str:
    """Return the lineage chain as one line of text.

    It reads 'a1 -> b2 (replay) -> c3 (replay)', and a removed ancestor is marked."""
    parts = []
    for link in chain:
        text = link["id"] + ("" if link["present"] else " (removed)")
        parts.append(text + (f" ({link['kind']})" if link["kind"] else ""))
    return " -> ".join(parts)
