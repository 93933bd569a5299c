"""How `fwk runs` commands print: a wide rich console, JSON to stdout, times and numbers."""

from __future__ import annotations

import json
from typing import Any

import typer


def console():
    from rich.console import Console

    return Console(highlight=False, width=max(Console().width, 150))


def echo_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


def when(ts: float | None) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else "-"


def num(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def metrics_text(metrics: dict[str, Any]) -> str:
    return "  ".join(f"{k} {num(v)}" for k, v in metrics.items())
