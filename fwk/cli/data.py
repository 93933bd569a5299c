"""`fwk data preview` and `fwk data prepare`: look at a recipe's data, or write it once as shards that stream."""

from __future__ import annotations

import typer

data = typer.Typer(help="Look at a recipe's data before training.", no_args_is_help=True)


@data.command(context_settings={"allow_extra_args": False, "ignore_unknown_options": True})
def preview(
    overrides: list[str] | None = typer.Argument(
        None,
        help="The overrides you would give `fwk train`: recipe=NAME, group=option, a.b=value, +new=x, ~key.",
        show_default=False,
    ),
    n: int = typer.Option(64, "--n", help="How many training samples to show (the first ones training draws)."),
) -> None:
    """Write the first N augmented training samples with their labels to runs/<id>/preview/.

    Images: a PNG grid, each label under its image. Text recipes: a .txt with
    each sample's input and target decoded. <id> is the run that `fwk train`
    with the same overrides would train. The preview alone does not make it a
    run, as no config.yaml is written.
    """
    from fwk.config.resolve import resolve
    from fwk.errors import UserError

    if n < 1:
        raise UserError(f"--n {n} is not allowed: expected a number of samples >= 1 (e.g. --n 64)")
    # Composed and resolved exactly as `fwk train` does, so the run id is the one it trains.
    resolved = resolve(list(overrides or []))
    config = resolved.config

    from fwk.data.build import build_data
    from fwk.data.preview import preview as write_preview
    from fwk.engine.state import seed_everything
    from fwk.launch.run import plan_run

    p = plan_run(resolved)  # the same cheap checks as `fwk train` (e.g. data.root), then its run id
    seed_everything(config.seed)  # as the engine does before it builds the data
    bundle = build_data(config.data, seed=config.seed)
    per_rank = config.train.batch_size // config.world_size
    line = write_preview(bundle, n, per_rank, config.world_size, config.seed, p.run_dir / "preview")
    typer.echo(f"run {p.run_id}: {line}")


@data.command(context_settings={"allow_extra_args": False, "ignore_unknown_options": True})
def prepare(
    overrides: list[str] | None = typer.Argument(
        None,
        help="The overrides you would give `fwk train` (its data section is written): recipe=NAME, data.root=...",
        show_default=False,
    ),
    out: str = typer.Option(
        ..., "--out", help="The folder or s3://bucket/prefix to write the prepared set to (then data.uri=it)."
    ),
    max_side: int = typer.Option(320, "--max-side", help="Shorter side of the stored images, at most, in px."),
    quality: int = typer.Option(90, "--quality", help="JPEG quality of the stored images (1-100)."),
    raw_max_side: int = typer.Option(
        64, "--raw-max-side", help="Store images whose longer side is at most this many px uncompressed (0: never)."
    ),
    chunk_mb: int = typer.Option(
        64, "--chunk-mb", help="Size of each shard file in MB: a worker streams whole chunks (many per worker)."
    ),
    workers: int = typer.Option(0, "--workers", help="Parallel workers (0: one per core)."),
    endpoint_url: str = typer.Option(
        "", "--endpoint-url", help="--out s3://: the S3-compatible endpoint (default: AWS_ENDPOINT_URL, else AWS)."
    ),
) -> None:
    """Write the recipe's image folder once as litdata shards, for data=streaming.

    Each image's shorter side is brought down to --max-side, with its aspect kept, and re-encoded
    as JPEG at --quality. Small ones, up to --raw-max-side, are stored uncompressed. Labels,
    class names, mean/std and a manifest are kept. The manifest holds the source's fingerprint,
    the settings and the counts. Rerunning finds a finished prepare, and an interrupted one starts
    again. A folder holding anything else is refused. To s3://, the set is prepared in a local
    staging folder, then uploaded, its manifest last.
    """
    import os

    from fwk.config.resolve import resolve
    from fwk.errors import UserError

    config = resolve(list(overrides or [])).config
    if config.data.name != "imagefolder":
        raise UserError(
            f"fwk data prepare writes image folders (data=imagefolder data.root=...); data={config.data.name} "
            "needs no preparing"
        )
    from fwk.data.prepare import prepare as write_shards

    workers = workers or os.cpu_count() or 1
    line = write_shards(config.data, out, max_side, quality, workers, raw_max_side, chunk_mb, endpoint_url)
    typer.echo(line)
