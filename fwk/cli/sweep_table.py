"""The table of a sweep's runs (`fwk runs --sweep ID`, and the end of `fwk train -m`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fwk.cli.output import console, echo_json, num


def print_sweep(root: Path, sid: str) -> None:
    """Print the table of `fwk runs --sweep ID`, which `fwk train -m` prints at its end."""
    from fwk.track.index import query
    from fwk.track.sweeps import find_sweep

    record = find_sweep(root, sid)
    if record is not None:
        show_sweep(record, query(root), as_json=False, pending=True)


def show_sweep(record: dict[str, Any], rows: list[dict[str, Any]], as_json: bool, pending: bool) -> None:
    """Show one row per run in the order of the combinations: a column per swept key, the
    metrics, and ★ for the best."""
    from fwk.track.sweeps import sweep_rows, tie_breaker

    members, metric = sweep_rows(record, rows, pending)
    if as_json:
        echo_json(members)
        return
    from rich.table import Table

    keys = list(record.get("swept") or [])
    names = list(dict.fromkeys(name for r in members for name in r["metrics"]))
    if metric is not None:
        names.sort(key=lambda n: n != metric[0])  # the ranking metric first
    best = "no complete run yet"
    if metric is not None:
        after = tie_breaker(metric[0])
        ties = f"; ties by {after}" if after else ""
        best = f"★ best by {metric_name(metric[0])} ({metric[1]}{ties})"
    out = console()
    out.print(f"sweep {record['sweep_id']}: {len(members)} runs over {', '.join(keys) or 'no key'}; {best}")
    table = Table(box=None, pad_edge=False)
    for name in ("", "#", "id", *keys, "status", "step"):
        table.add_column(name, justify="right" if name in ("#", "step") else "left", no_wrap=True)
    for name in names:
        table.add_column(metric_name(name), justify="right", no_wrap=True)
    order = {m["run_id"]: str(i) for i, m in enumerate(record["members"], 1)}
    for r in members:
        table.add_row(
            "★" if r["best"] else "",
            order.get(r["id"], "-"),
            r["id"],
            *(str(r["swept"].get(k, "-")) for k in keys),
            r["status"],
            "-" if r["step"] is None else str(r["step"]),
            *("-" if r["metrics"].get(n) is None else num(r["metrics"][n]) for n in names),
        )
    out.print(table)


def metric_name(name: str) -> str:
    return "train loss" if name == "loss" else name  # the index's "loss" is the last train loss
