"""`fwk profile`: compose like `fwk train`, profile a few real training steps, say where the
time and memory go and what to change."""

from __future__ import annotations

from typing import Any

import typer


def profile(
    overrides: list[str] | None = typer.Argument(
        None,
        help="Hydra overrides, as for fwk train: recipe=NAME, group=option, a.b=value.",
        show_default=False,
    ),
    steps: int = typer.Option(3, "--steps", help="Training steps recorded by the profiler."),
    warmup: int = typer.Option(2, "--warmup", help="Training steps run first and not recorded (>= 1)."),
    graph: bool = typer.Option(
        False, "--graph", help="Also write the model graph before and after the JIT layer's optimizations (graph.html)."
    ),
) -> None:
    """Profile the recipe's real training step and say what to change.

    Runs warm-up + steps optimizer steps of the run these overrides would train under
    torch.profiler, in a throwaway run dir. They run with its precision, memory and jit settings,
    in one process. Prints the top operators, time and peak memory per module, and the step split
    into data, forward, backward, optimizer and communication, with advice that quotes its figure.
    Writes runs/<id>/profile/: trace.json (Chrome/Perfetto), flame_time.svg,
    flame_memory.svg and profile.json with every figure.
    """
    import os

    # before torch loads: kineto's own "profiler_start/stop" lines on stderr say nothing to a user
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    from fwk.errors import UserError

    words = list(overrides or [])
    flags = [w for w in words if w.startswith("-")]
    if flags:
        raise UserError(f"unknown option '{flags[0]}' for fwk profile; its options are --steps, --warmup, --graph")
    if steps < 1:
        raise UserError(f"--steps={steps} is not allowed: expected a whole number of steps >= 1")
    if warmup < 1:
        raise UserError(f"--warmup={warmup} is not allowed: expected >= 1 (the first step builds the engine)")

    from fwk.config.grammar import typed_keys
    from fwk.config.resolve import resolve
    from fwk.track import startup

    resolved = resolve(words)
    config = resolved.config
    startup.mark("config")

    from rich.console import Console

    from fwk.launch.run import plan_run
    from fwk.profile.capture import capture
    from fwk.profile.report import build, show, write
    from fwk.strategies.preflight import preflight

    p = plan_run(resolved)  # the run id `fwk train` would give these overrides (the same checks first)
    for line in preflight(config, typed_keys(words)):
        typer.echo(line)
    out = p.run_dir / "profile"
    out.mkdir(parents=True, exist_ok=True)
    startup.mark("imports")  # the plan and the pre-flight checks, which import torch
    captured = capture(config, warmup, steps, out)
    figs = build(captured, _settings(config, p.run_id, warmup), out)
    if graph:
        from fwk.profile.graph import write_graph

        figs["files"]["graph"] = str(write_graph(config, out))
    write(figs, out)
    console = Console(highlight=False, width=max(Console().width, 120))
    show(figs, console)
    typer.echo(f"profile of run {p.run_id} in {out}")
    for name, path in figs["files"].items():
        typer.echo(f"  {name:<13} {path}")


def _settings(config: Any, run_id: str, warmup: int) -> dict[str, Any]:
    """Return the settings the profile ran under, which its advice reads and profile.json keeps."""
    return {
        "recipe": config.recipe,
        "run_id": run_id,
        "warmup": warmup,
        "precision": config.precision.name,
        "memory": config.memory.name,
        "jit": config.jit.name,
        "parallel": config.parallel.name,
        "comm_hook": config.parallel.comm_hook,
        "num_workers": config.loader.num_workers,
        "pin_memory": config.loader.pin_memory,
        "batch_size": config.train.batch_size,
    }
