"""The profile on screen, in rich tables, and on disk, in ``profile.json`` and flame graphs.

Every figure printed is in ``profile.json``, under the same names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fwk.profile import advice as rules
from fwk.profile import figures, flame
from fwk.profile.capture import Captured
from fwk.profile.trace import Trace

TOP_OPERATORS = 15
TOP_MODULES = 15


def build(captured: Captured, settings: dict[str, Any], out: Path) -> dict[str, Any]:
    """Read the trace, write the flame graphs and profile.json, and return the figures."""
    trace = Trace.load(captured.trace)
    figs: dict[str, Any] = {
        "device": captured.device,
        "hardware": captured.hardware,
        "settings": settings,
        "steps": len(trace.steps),
        "operators": figures.operators(trace),
        "modules": figures.modules(trace, captured.modules),
        "split": figures.split(trace),
        "memory": figures.memory(trace, captured.hardware["memory_bytes"]),
        "facts": figures.compute_facts(trace),
        "notes": captured.notes,
        "startup": figures.startup(captured.startup, captured.startup_memory),
    }
    for r in figs["modules"]["rows"]:
        r["share_of_step"] = (r["forward_ms_per_step"] + r["backward_ms_per_step"]) / max(
            figs["split"]["step_ms"], 1e-9
        )
    signals = rules.signals(figs, settings, captured.hardware)
    figs["signals"] = signals
    figs["advice"] = rules.as_dicts(rules.advise(signals))
    basis = "kernel time" if trace.on_device else "host self time"
    (out / "flame_time.svg").write_text(
        flame.svg(flame.time_stacks(trace, captured.modules), f"fwk profile: time per op and layer ({basis})", "us"),
        encoding="utf-8",
    )
    (out / "flame_memory.svg").write_text(
        flame.svg(
            flame.memory_stacks(trace, captured.modules),
            f"fwk profile: memory allocated per op and layer ({figs['memory']['device']})",
            "bytes",
        ),
        encoding="utf-8",
    )
    figs["files"] = {
        "trace": str(captured.trace),
        "flame_time": str(out / "flame_time.svg"),
        "flame_memory": str(out / "flame_memory.svg"),
        "profile": str(out / "profile.json"),
        "engine_log": str(out / "engine.log"),
    }
    return figs


def write(figs: dict[str, Any], out: Path) -> None:
    (out / "profile.json").write_text(json.dumps(figs, indent=2) + "\n", encoding="utf-8")


def _ms(x: float) -> str:
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


def cover_line(ops: dict[str, Any]) -> str:
    return f"{ops['k']} of {ops['n']} operators take {ops['cover']:.0%} of the time"


def show(figs: dict[str, Any], console: Console) -> None:
    ops, split, mods, mem = figs["operators"], figs["split"], figs["modules"], figs["memory"]
    basis = "device (kernel) time" if ops["basis"] == "device" else "host time"
    console.print(
        f"[bold]step {_ms(split['step_ms'])} ms[/bold] on {figs['device']} ({figs['hardware']['text']}), "
        f"mean of {figs['steps']} profiled steps; peak memory {mem['peak_mb']:.1f} MiB ({mem['device']})"
    )
    for note in figs["notes"]:
        console.print(f"note: {note}")

    table = Table(title=f"Top operators by self {basis}, per step", title_justify="left", min_width=72)
    for col, justify in (("#", "right"), ("operator", "left"), ("calls", "right"), ("self ms", "right")):
        table.add_column(col, justify=justify)
    table.add_column("share", justify="right")
    table.add_column("cumulative", justify="right")
    for i, r in enumerate(ops["rows"][:TOP_OPERATORS], 1):
        table.add_row(
            str(i),
            r["name"],
            f"{r['calls_per_step']:.0f}",
            _ms(r["self_ms_per_step"]),
            f"{r['share']:.1%}",
            f"{r['cumulative']:.1%}",
        )
    console.print(table)
    console.print(cover_line(ops))

    table = Table(title=f"Modules: {basis} and peak memory, per step", title_justify="left", min_width=72)
    for col, justify in (
        ("module", "left"),
        ("type", "left"),
        ("forward ms", "right"),
        ("backward ms", "right"),
        ("of step", "right"),
        (f"peak MiB ({mods['memory_device']})", "right"),
    ):
        table.add_column(col, justify=justify)
    for r in mods["rows"][:TOP_MODULES]:
        table.add_row(
            r["name"],
            r["type"],
            _ms(r["forward_ms_per_step"]),
            _ms(r["backward_ms_per_step"]),
            f"{r['share_of_step']:.1%}",
            f"{r['peak_mb']:.1f}",
        )
    if mods["rows"]:
        console.print(table)
    else:
        console.print("Modules: none recorded (a compiled model runs as one graph; profile jit=off to see each module)")
    if len(mods["rows"]) > TOP_MODULES:
        console.print(f"({len(mods['rows']) - TOP_MODULES} more modules in profile.json)")

    table = Table(title=f"The step ({basis}; data: host wait)", title_justify="left", min_width=40)
    for col, justify in (("part", "left"), ("ms", "right"), ("share", "right")):
        table.add_column(col, justify=justify)
    for r in split["rows"]:
        table.add_row(r["part"], _ms(r["ms_per_step"]), f"{r['share']:.1%}")
    console.print(table)

    start = figs.get("startup") or {"rows": []}
    if start["rows"]:
        table = Table(title=start["title"], title_justify="left", min_width=64)
        for col in ("phase", "seconds", "MiB added"):
            table.add_column(col, justify="left" if col == "phase" else "right")
        for r in start["rows"]:
            mib = "-" if r["mib"] is None else f"{r['mib']:.0f}"
            table.add_row(r["phase"], f"{r['seconds']:.2f}", mib)
        console.print(table)
        console.print(start["line"])

    if figs["advice"]:
        console.print("[bold]Advice[/bold]")
        for a in figs["advice"]:
            console.print(f"- {a['line']}", markup=False, soft_wrap=True)  # one line each, however long
    else:
        console.print("Advice: none; no figure crosses a threshold")
