"""`fwk train`: compose the config, resolve the run, launch the workers."""

from __future__ import annotations

import sys

import typer


def train(
    overrides: list[str] | None = typer.Argument(
        None,
        help="Hydra overrides: recipe=NAME, group=option, a.b=value, +new=x, ~key.",
        show_default=False,
    ),
    cfg: bool = typer.Option(False, "--cfg", help="Print the resolved config and exit."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the run id and what would be launched, then exit (no model checks)."
    ),
) -> None:
    """Train a model. Runs the default recipe (digits_cnn) when given no overrides.

    The same command on the same code is the same run: it resumes from its latest
    checkpoint, or shows the summary of a run that already finished.
    """
    from omegaconf import OmegaConf

    from fwk.config.compose import compose
    from fwk.config.validate import to_typed

    raw = compose(list(overrides or []))
    config = to_typed(raw)
    config_dict = OmegaConf.to_container(OmegaConf.structured(config), resolve=True)
    config_yaml = OmegaConf.to_yaml(config_dict)
    if cfg:
        typer.echo(config_yaml, nl=False)
        return

    from fwk.launch.launcher import launch, plan

    for section in (config.model, config.data, config.optim):
        if hasattr(section, "check"):  # cheap pre-flight checks (paths) before any run dir exists
            section.check()
    p = plan(config, config_dict)
    if dry_run:
        typer.echo(p.describe())
        return
    from fwk.cli.report import already_complete, finished
    from fwk.track.store import RunDir

    done = RunDir(p.run_dir).read_summary()
    if done is not None:
        from fwk.track.index import record_quietly

        record_quietly(RunDir(p.run_dir))  # an index rebuilt or copied without it learns of it here
        typer.echo(already_complete(done, p.run_dir))
        return
    # Only now import torch: the checks of the model and the device take seconds to import,
    # and --cfg, --dry-run and a finished run answer without them.
    from fwk.engine import tracking
    from fwk.engine.build import preflight

    preflight(config)
    tracking.check(config.tracking)  # a tracking server that does not answer: before any run dir
    status, run = launch(p, config_yaml, config.parallel.nnodes, overrides=list(overrides or []))
    summary = run.read_summary()
    if status == 0 and summary is not None:
        typer.echo(finished(summary, run.path))
    sys.exit(status)
