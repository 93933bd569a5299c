"""`fwk train`: compose the config, resolve the run, launch the workers (`-m`: one run per combination)."""

from __future__ import annotations

import sys

import typer


def train(
    overrides: list[str] | None = typer.Argument(
        None,
        help="Hydra overrides: recipe=NAME, group=option, a.b=value, +new=x, ~key. With -m: a=1,2 range(..) glob(..).",
        show_default=False,
    ),
    cfg: bool = typer.Option(False, "--cfg", help="Print the resolved config and exit."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the run id and what would be launched, then exit (no model checks)."
    ),
    redecide: bool = typer.Option(
        False,
        "--redecide",
        help="Measure the auto decisions (precision, memory, jit, loader) afresh instead of reusing those cached "
        "for this model on this machine, and cache the new ones.",
    ),
    multirun: bool = typer.Option(
        False,
        "--multirun",
        "-m",
        help="Sweep: one run per combination of the swept values (optim.lr=0.1,0.01 precision=fp32,bf16), "
        "one after another, grouped under a sweep id (fwk runs --sweep ID).",
    ),
) -> None:
    """Train a model. Runs the default recipe (digits_cnn) when given no overrides.

    The same command on the same code is the same run: it resumes from its latest
    checkpoint, or shows the summary of a run that already finished. Its auto decisions
    are measured the first time a model trains on a machine, and reused after that.
    """
    orders = {"redecide": True} if redecide else {}  # to the workers, through the run dir
    if multirun:
        _sweep(list(overrides or []), cfg, dry_run, orders)
        return
    from fwk.config.resolve import resolve
    from fwk.launch.run import Job, plan_run, run
    from fwk.track import startup

    r = resolve(list(overrides or []))
    startup.mark("config")
    if cfg:
        typer.echo(r.as_yaml, nl=False)
        return
    job = Job(r, plan_run(r), overrides=list(overrides or []), orders=orders)
    if dry_run:
        typer.echo(job.plan.describe())
        return
    # torch is imported only past this point, and only for a run that trains: --cfg,
    # --dry-run and a finished run answer without it
    sys.exit(run(job).status)


def _sweep(overrides: list[str], cfg: bool, dry_run: bool, orders: dict[str, bool]) -> None:
    """Run `fwk train -m`. Every combination is composed and checked before the first one runs."""
    from fwk.launch.sweep import prepare, run_sweep

    sweep = prepare(overrides, checks=not cfg)
    if cfg:
        typer.echo(sweep.configs(), nl=False)
        return
    if dry_run:
        typer.echo(sweep.describe())
        return
    outcome = run_sweep(sweep, orders=orders)
    from fwk.cli.sweep_table import print_sweep

    print_sweep(sweep.root, sweep.id)
    last = outcome.last_line(sweep)
    if last is not None:
        print(last, file=sys.stderr)
    sys.exit(outcome.status)
