"""`fwk doctor`: what this machine offers fwk, and whether N processes can talk."""

from __future__ import annotations

import typer


def doctor(
    dist: int | None = typer.Option(
        None, "--dist", help="Also start N >= 2 processes and check a barrier and an all-reduce.", show_default=False
    ),
    timeout: float = typer.Option(30.0, "--timeout", help="Seconds each rank gets to answer (with --dist)."),
    stall_rank: int = typer.Option(-1, "--stall-rank", hidden=True, help="Test the check: this rank never answers."),
) -> None:
    """Report the environment and what fwk's auto options would pick here: torch, CUDA,
    NCCL, Triton, the CPU's features and memory. With --dist N, check collectives across N processes."""
    from fwk.errors import UserError
    from fwk.launch import doctor as checks

    if dist is not None and dist < 2:
        raise UserError(f"--dist={dist} is not allowed: expected an integer >= 2 (processes to check)")
    for key, value in checks.report():
        typer.echo(f"{key:<22} {value}")
    if dist is not None:
        missing, seconds = checks.collectives(dist, timeout, stall_rank)
        if missing:
            names = ", ".join(str(r) for r in missing)
            raise UserError(
                f"collectives across {dist} processes failed: rank(s) {names} did not answer within {timeout:g} s"
            )
        typer.echo(f"{'collectives':<22} barrier + all-reduce across {dist} processes ok in {seconds:.2f} s")
