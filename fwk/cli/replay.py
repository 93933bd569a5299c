"""`fwk replay ID`: re-run a run from its recorded config into a new run dir linked to it,
then compare the two runs' metrics step by step and say whether they match."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from fwk.errors import UserError
from fwk.log import show, stdout_on_stderr


def replay(
    run_id: str = typer.Argument(..., metavar="ID", help="A run id or a unique prefix of one."),
    force: bool = typer.Option(
        False, "--force", help="Replay even if the code or the data changed since the run (prints the code diff)."
    ),
    tolerance: float = typer.Option(
        1e-4,
        "--tolerance",
        help="Largest relative difference (|a - b| / max(1, |a|, |b|)) accepted when values are not identical.",
    ),
    root: Path | None = typer.Option(
        None, "--root", help="The runs root (default: $FWK_RUNS, else ./runs).", show_default=False
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the verdict as JSON to stdout."),
    trust_config: bool = typer.Option(False, "--trust-config", help="Build its nested _target_ (a config you wrote)."),
    redecide: bool = typer.Option(
        False,
        "--redecide",
        help="Measure the auto decisions afresh instead of re-applying the original run's (precision format, "
        "memory plan, jit's compile steps, loader workers).",
    ),
) -> None:
    """Re-execute a run from its recorded config and compare its metrics with the original's, step by step.

    The code and the data must be the same as the original's, else the replay is refused unless --force.
    The original's measured decisions are re-applied, not made again: the precision format
    with its trial steps, the memory plan, jit's compile and verdict steps, and the loader's
    workers. So a replay on a quieter or another machine computes the same thing.
    A replay is identical on CPU. On a GPU, set train.deterministic=true in the original run for bit-exact
    replays, else the largest difference is held against --tolerance. The replay is a new
    run dir linked to the original, and `fwk runs show` prints the lineage. Replaying again
    compares the existing replay.
    """
    from fwk.config.resolve import from_dict
    from fwk.config.trust import check_recorded
    from fwk.launch.run import Job, plan_run, run
    from fwk.track import replay as rp
    from fwk.track.lookup import find_run, runs_root
    from fwk.track.run_id import code_version
    from fwk.track.status import read_config, read_json

    show("stderr")  # the replay's lines and its run's: stdout holds the verdict alone
    if tolerance < 0:
        raise UserError(f"--tolerance {tolerance:g} must be >= 0")
    original = find_run(root or runs_root(), run_id)
    config_dict = read_config(original)
    if not config_dict:
        raise UserError(f"{original.config} is missing or not valid YAML; run {original.id} cannot be replayed")
    if not original.metrics.is_file():
        raise UserError(f"run {original.id} logged no metrics ({original.metrics} is missing): nothing to compare")
    trust_config or check_recorded(config_dict, str(original.config))  # before anything of it is built
    config_dict.setdefault("paths", {})["runs"] = str(original.path.parent)  # the replay lands beside it
    try:
        # the config as `fwk train` writes it: keys added to the schema since the run take their defaults
        resolved = from_dict(config_dict)
    except UserError as exc:
        raise UserError(f"run {original.id}'s recorded config does not validate on this code: {exc}") from None
    if resolved.config.parallel.nnodes > 1:
        raise UserError(
            f"run {original.id} ran on {resolved.config.parallel.nnodes} nodes; replay it with the same multi-node "
            "launch (fwk train with its config on every node)"
        )
    meta = read_json(original.meta) or {}
    notes = rp.check_code(str(meta.get("code", "unknown")), code_version(), force)
    p = plan_run(resolved, salt=rp.salt(original))
    notes += rp.check_data(meta.get("data"), p.data, force)
    for line in notes:
        print(line, file=sys.stderr)
    line, orders = _reapply(original, redecide)
    print(line, file=sys.stderr)
    job = Job(resolved, p, lineage={"parent": original.id, "kind": "replay"}, orders=orders)
    with stdout_on_stderr():  # the run's progress bar and its workers' lines: stdout is the verdict's
        result = run(
            job,
            starting=f"replaying run {original.id} as run {p.run_id} ({p.run_dir})",
            done=lambda summary, replay: f"replay {replay.id} of run {original.id} is already complete; comparing it",
        )
    _verdict(original, result.run, tolerance, result.status, as_json)


def _reapply(original, redecide: bool) -> tuple[str, dict]:
    """Return the line to say and the orders for the replay's workers. The orders hand them the
    original's decisions, or ask them to measure afresh."""
    from fwk.track.replay import recorded_decisions
    from fwk.track.status import read_json

    if redecide:
        return f"deciding afresh (--redecide), not re-applying run {original.id}'s decisions", {"redecide": True}
    records = recorded_decisions(original.read_summary(), read_json(original.path / "env.json"))
    if not records:
        return f"run {original.id} recorded no measured decisions: the replay decides as a new run would", {}
    shown = ", ".join(f"{name} {_choice(name, r)}" for name, r in records.items())
    return f"re-applying run {original.id}'s decisions: {shown} (--redecide decides afresh)", {"replay": records}


def _choice(name: str, record: dict) -> str:
    # a measured decision's trial steps were redone as decided: the replay runs none
    if name == "jit" and record.get("compile_at") is not None and record["choice"] == "compiled":
        return f"{record['choice']} (from step {record['compile_at']})"
    if name == "loader":
        return f"{record['choice']} workers"
    return str(record["choice"])


def _verdict(original, run, tolerance: float, status: int, as_json: bool) -> None:
    from fwk.track.replay import compare

    c = compare(original, run)
    largest = c.largest
    if status != 0:
        verdict, code = f"the replay failed (exit {status}) after {c.rows} comparable rows", status
    elif c.only_a:
        verdict, code = f"differs: the replay lacks {len(c.only_a)} rows the original logged", 1
    elif c.identical:
        verdict, code = f"identical: {c.values} values in {c.rows} rows are equal", 0
    else:
        assert largest is not None
        ok = c.within(tolerance)
        verdict = (
            f"{'within tolerance' if ok else 'differs'}: {c.differing} of {c.values} values differ, "
            f"{'at most' if ok else 'up to'} {largest.relative:.2e} relative (tolerance {tolerance:g})"
        )
        code = 0 if ok else 1
    if as_json:
        data = {
            "original": original.id,
            "replay": run.id,
            "verdict": verdict.split(":")[0],
            "rows": c.rows,
            "values": c.values,
            "differing": c.differing,
            "largest": None if largest is None else {**largest.__dict__, "relative": largest.relative},
            "tolerance": tolerance,
            "replay_only_rows": len(c.only_b),
        }
        typer.echo(json.dumps(data, indent=2))
    else:
        if largest is not None:
            typer.echo(
                f"largest difference: {largest.key} at {largest.kind} step {largest.step}: "
                f"{largest.a!r} vs {largest.b!r}"
            )
        if c.only_b:
            typer.echo(f"the replay logged {len(c.only_b)} rows past where run {original.id} stopped (not compared)")
        typer.echo(f"replay {run.id} of run {original.id}: {verdict}")
    if code:
        raise typer.Exit(code)
