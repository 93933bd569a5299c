"""`fwk runs`: list, show, diff, plot and remove runs. It reads the run index and run dirs, and
imports no torch."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import typer

from fwk.cli.output import console, echo_json, metrics_text, num, when
from fwk.cli.sweep_table import show_sweep
from fwk.errors import UserError
from fwk.log import show as show_lines

runs = typer.Typer(
    help="List the runs under the runs root (newest first); show, diff, plot or remove them.",
    invoke_without_command=True,
)

_ROOT = typer.Option(None, "--root", help="The runs root (default: $FWK_RUNS, else ./runs).", show_default=False)
_JSON = typer.Option(False, "--json", help="Print machine-readable JSON to stdout instead of a table.")


def _root(root: Path | None) -> Path:
    from fwk.track.lookup import runs_root

    return root or runs_root()


@runs.callback()
def list_runs(
    ctx: typer.Context,
    recipe: str | None = typer.Option(None, "--recipe", help="Only runs of this recipe."),
    status: str | None = typer.Option(
        None, "--status", help="Only runs in this state: running, complete, failed, interrupted."
    ),
    tag: list[str] = typer.Option([], "--tag", help="Only runs with this tag (repeat: all of them)."),
    sweep: str | None = typer.Option(
        None, "--sweep", help="The runs of this sweep id (or prefix) side by side, the best marked."
    ),
    root: Path | None = _ROOT,
    as_json: bool = _JSON,
) -> None:
    """List the runs under the runs root, newest first (`fwk runs show|diff|rm` for one run)."""
    show_lines("stderr")  # a rebuilt index says so there: stdout holds the table or the JSON
    if ctx.invoked_subcommand is not None:
        return
    from fwk.track.index import query
    from fwk.track.status import STATUSES

    if status is not None and status not in STATUSES:
        raise UserError(f"--status {status} is not a run state: expected one of {', '.join(STATUSES)}")
    if sweep is not None:
        from fwk.track.sweeps import find_sweep

        record = find_sweep(_root(root), sweep)
        if record is not None:  # else: a sweep known only from meta.json (its record was deleted)
            rows = query(_root(root), recipe=recipe, status=status, tags=tag)
            show_sweep(record, rows, as_json, pending=not (recipe or status or tag))
            return
    rows = query(_root(root), recipe=recipe, status=status, tags=tag, sweep=sweep)
    if as_json:
        echo_json(rows)
        return
    if not rows:
        typer.echo(
            f"no runs under {_root(root)}" + (" match these filters" if recipe or status or tag or sweep else "")
        )
        return
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for name in ("id", "recipe", "status", "step", "metrics", "tags", "created", "updated"):
        table.add_column(
            name,
            justify="right" if name == "step" else "left",
            no_wrap=name != "tags",
            min_width=11 if name == "status" else None,
        )
    colors = {"running": "cyan", "complete": "green", "failed": "red", "interrupted": "yellow"}
    for r in rows:
        step = "-" if r["step"] is None else str(r["step"])
        if r["max_steps"] and r["status"] != "complete":
            step += f"/{r['max_steps']}"
        table.add_row(
            r["id"],
            r["recipe"] or "-",
            f"[{colors[r['status']]}]{r['status']}[/]" if r["status"] in colors else r["status"],
            step,
            metrics_text(r["metrics"]),
            ",".join(r["tags"]),
            when(r["created"]),
            when(r["updated"]),
        )
    console().print(table)


def _files(run_path: Path) -> list[dict[str, Any]]:
    """List the top-level files with their sizes, and folders with their file count and total size."""
    out = []
    for p in sorted(run_path.iterdir()):
        if p.name.startswith("."):
            continue
        if p.is_dir():
            inner = [f for f in p.rglob("*") if f.is_file()]
            out.append({"name": p.name + "/", "files": len(inner), "bytes": sum(f.stat().st_size for f in inner)})
        else:
            out.append({"name": p.name, "files": 1, "bytes": p.stat().st_size})
    return out


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@runs.command()
def show(
    run_id: str = typer.Argument(..., metavar="ID", help="A run id or a unique prefix of one."),
    root: Path | None = _ROOT,
    as_json: bool = _JSON,
) -> None:
    """Show one run: its row, config, summary, lineage (parent, sweep, exports) and files."""
    from fwk.track import lineage
    from fwk.track.index import query
    from fwk.track.lookup import find_run
    from fwk.track.status import flatten, read_config, read_json, row_from_dir

    run = find_run(_root(root), run_id)
    row = row_from_dir(run)
    chain = lineage.ancestors(run)
    derived = lineage.children(_root(root), query(_root(root)), run.id)
    exports = (
        sorted(p.name for p in (run.path / "exports").iterdir() if p.is_dir())
        if (run.path / "exports").is_dir()
        else []
    )
    data = {
        **row,
        "path": str(run.path),
        "config": read_config(run),
        "summary": read_json(run.summary),
        "meta": read_json(run.meta),
        "env": read_json(run.path / "env.json"),
        "lineage": {
            "parent": row["parent"],
            "kind": chain[-1]["kind"],
            "chain": chain,
            "children": derived,
            "sweep": row["sweep"],
            "exports": exports,
        },
        "files": _files(run.path),
    }
    if as_json:
        echo_json(data)
        return
    from rich.table import Table

    out = console()
    head = Table(box=None, show_header=False, pad_edge=False)
    head.add_column(style="bold")
    head.add_column()
    head.add_row("run", f"{row['id']}  ({run.path})")
    head.add_row("recipe", row["recipe"] or "-")
    head.add_row("status", row["status"])
    head.add_row("step", "-" if row["step"] is None else f"{row['step']} of {row['max_steps']}")
    head.add_row("tags", ", ".join(row["tags"]) or "-")
    head.add_row("created", when(row["created"]))
    meta = data["meta"] or {}
    head.add_row("code", str(meta.get("code", "-")))
    data_fp = meta.get("data") or {}
    head.add_row("data", f"{data_fp.get('digest') or '-'}: {data_fp.get('what', 'not recorded')}")
    head.add_row("launches", _launches_text(meta, data["env"]))
    head.add_row("lineage", lineage.chain_text(chain))
    if derived:
        head.add_row("derived", ", ".join(f"{c['id']} ({c['kind'] or 'run'}, {c['status']})" for c in derived))
    head.add_row("sweep", row["sweep"] or "-")
    head.add_row("exports", ", ".join(exports) or "-")
    out.print(head)
    if data["summary"]:
        out.print("\n[bold]summary[/]")
        summary = Table(box=None, show_header=False, pad_edge=False)
        summary.add_column()
        summary.add_column()
        for key, value in flatten(data["summary"]).items():
            summary.add_row(key, num(value))
        out.print(summary)
    out.print("\n[bold]config[/] (config.yaml)")
    out.print(run.config.read_text().rstrip(), markup=False)
    out.print("\n[bold]files[/]")
    files = Table(box=None, show_header=False, pad_edge=False)
    files.add_column()
    files.add_column(justify="right")
    for f in data["files"]:
        files.add_row(f["name"], _size(f["bytes"]) + (f"  ({f['files']} files)" if f["name"].endswith("/") else ""))
    out.print(files)


def _launches_text(meta: dict[str, Any], env: dict[str, Any] | None) -> str:
    """Describe the launches from meta.json and env.json.

    A line reads ``2 (resumed at step 150); last on vm: NVIDIA H200, ...``."""
    count = len(meta.get("launches") or [])
    runs = (env or {}).get("launches") or []
    resumed = [str(r.get("from_step")) for r in runs if r.get("from_step")]
    text = f"{count}" + (f" (resumed at step {', '.join(resumed)})" if resumed else "")
    if runs:
        machine = runs[-1].get("machine") or {}
        where = f"{machine.get('host', '?')}: {machine.get('device', '?')}"
        text += f"; last on {where}, world size {machine.get('world_size', '?')}"
    return text


_MISSING = "<absent>"


def _final_metrics(run) -> dict[str, Any]:
    from fwk.track.status import last_train, read_json

    summary = read_json(run.summary) or {}
    step, loss = last_train(run)
    out: dict[str, Any] = {"step": summary.get("final_step", step), "train loss": loss}
    out.update(summary.get("eval") or {})
    return {k: v for k, v in out.items() if v is not None}


@runs.command()
def diff(
    a: str = typer.Argument(..., metavar="A", help="A run id or unique prefix."),
    b: str = typer.Argument(..., metavar="B", help="Another run id or unique prefix."),
    root: Path | None = _ROOT,
    as_json: bool = _JSON,
) -> None:
    """Compare two runs: the config keys that differ, then final metrics side by side."""
    from fwk.track.lookup import find_run
    from fwk.track.status import flatten, read_config

    run_a, run_b = find_run(_root(root), a), find_run(_root(root), b)
    conf_a, conf_b = flatten(read_config(run_a)), flatten(read_config(run_b))
    config = [
        {"key": k, "a": conf_a.get(k, _MISSING), "b": conf_b.get(k, _MISSING)}
        for k in sorted(set(conf_a) | set(conf_b))
        if conf_a.get(k, _MISSING) != conf_b.get(k, _MISSING)
    ]
    met_a, met_b = _final_metrics(run_a), _final_metrics(run_b)
    metrics = []
    for name in list(dict.fromkeys([*met_a, *met_b])):
        va, vb = met_a.get(name), met_b.get(name)
        both = isinstance(va, int | float) and isinstance(vb, int | float)
        metrics.append({"name": name, "a": va, "b": vb, "diff": vb - va if both else None})
    if as_json:
        echo_json({"a": run_a.id, "b": run_b.id, "config": config, "metrics": metrics})
        return
    from rich.table import Table

    out = console()
    table = Table(title=f"config: {len(config)} keys differ", box=None, pad_edge=False, title_justify="left")
    table.add_column("key")
    table.add_column(f"A {run_a.id}")
    table.add_column(f"B {run_b.id}")
    for row in config:
        table.add_row(row["key"], num(row["a"]), num(row["b"]))
    out.print(table)
    out.print()
    table = Table(title="final metrics", box=None, pad_edge=False, title_justify="left")
    table.add_column("metric")
    for name in (f"A {run_a.id}", f"B {run_b.id}", "B - A"):
        table.add_column(name, justify="right")
    for row in metrics:
        d = row["diff"]
        table.add_row(
            row["name"],
            "-" if row["a"] is None else num(row["a"]),
            "-" if row["b"] is None else num(row["b"]),
            "-" if d is None else (f"{d:+.4g}" if isinstance(d, float) else f"{d:+d}"),
        )
    out.print(table)


@runs.command()
def rm(
    run_id: str = typer.Argument(..., metavar="ID", help="A run id or a unique prefix of one."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Remove without asking."),
    root: Path | None = _ROOT,
    as_json: bool = _JSON,
) -> None:
    """Remove a run dir (config, metrics, checkpoints, exports) and its index row. Asks first."""
    import fcntl

    from fwk.track.index import forget
    from fwk.track.lookup import find_run
    from fwk.track.status import row_from_dir, running

    run = find_run(_root(root), run_id)
    if who := running(run):
        raise UserError(f"run {run.id} is running ({who}); stop it (Ctrl-C in its terminal) before removing it")
    row = row_from_dir(run)
    what = f"run {run.id} ({row['recipe']}, {row['status']}, step {row['step']}) at {run.path}"
    if not yes and not typer.confirm(f"Remove {what}?", default=False, err=True):
        typer.echo("nothing removed", err=True)
        raise typer.Exit(1)
    # hold the run's lock while removing: a `fwk train` of this run cannot start halfway
    with open(run.path / ".lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"run {run.id} started running; nothing removed") from None
        shutil.rmtree(run.path)
    forget(run.path.parent, run.id)
    if as_json:
        echo_json({"removed": run.id, "path": str(run.path)})
    else:
        print(f"removed {what}", file=sys.stdout)


def _plot_name(ids: list[str]) -> str:
    """Name the plot <id1>+<id2>+<id3>.png. For more runs the name holds the first id, the
    count and a hash of them all."""
    if len(ids) <= 3:
        return "+".join(ids) + ".png"
    import hashlib

    digest = hashlib.sha1(",".join(sorted(ids)).encode()).hexdigest()[:8]
    return f"{ids[0]}+{len(ids) - 1}-more-{digest}.png"


@runs.command()
def plot(
    run_ids: list[str] = typer.Argument(..., metavar="ID", help="Run ids or unique prefixes, overlaid."),
    out: Path | None = typer.Option(
        None, "--out", help="Where to write the PNG (default: <runs root>/plots/<id>+<id>.png).", show_default=False
    ),
    root: Path | None = _ROOT,
    as_json: bool = typer.Option(False, "--json", help="Print the path, runs and metrics as JSON instead of the path."),
    x: str = typer.Option(
        "step", "--x", help="The x axis: step, time (training seconds) or samples (seen); target crossings dashed."
    ),
) -> None:
    """Plot the train loss and each eval metric of one or more runs into a PNG, and print its path."""
    from fwk.track.lookup import find_run
    from fwk.track.plot import draw, load, metric_names, no_data, with_data

    if x not in ("step", "time", "samples"):
        raise UserError(f"--x {x} is not an axis: expected step, time or samples")
    if out is not None and out.suffix.lower() != ".png":
        raise UserError(f"--out {out} is not a .png path: the plot is a PNG; give a name ending in .png")
    named = [find_run(_root(root), i) for i in run_ids]
    found = list({run.id: run for run in named}.values())  # a run named twice (two prefixes): plotted once
    curves = with_data(load(found, x))
    empty = [r for r in found if r.id not in {c.run.id for c in curves}]
    if empty:  # a run just started, beside others: plot those
        print(f"fwk: warning: {no_data(empty)}; plotting the other {len(curves)}", file=sys.stderr)
    path = draw(curves, out or _root(root) / "plots" / _plot_name([c.run.id for c in curves]), x).resolve()
    if as_json:
        echo_json(
            {
                "path": str(path),
                "runs": [c.run.id for c in curves],
                "metrics": metric_names(curves),
                "skipped": [r.id for r in empty],
            }
        )
    else:
        print(path, file=sys.stdout)
