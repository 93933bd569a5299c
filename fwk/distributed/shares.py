"""How a global batch is shared out among processes: the per-process batch and the accumulation steps.

It is plain arithmetic, no torch. The config check uses it before any work
(fwk/config/validate.py), and the trainer uses it when a run resumes on another number of
processes (fwk/distributed/resize.py)."""

from __future__ import annotations

from fwk.errors import UserError


def split(global_batch: int, world: int, written: int | None) -> tuple[int, int]:
    """Return the per-process batch and accumulation steps that keep ``global_batch`` on ``world``
    processes, for a checkpoint written by ``written``. ``written`` is None for a new run.

    Pick the fewest accumulation steps whose per-process batch divides the global batch evenly
    and is no larger than the written run's, since its memory fitted. On half the processes,
    each keeps its batch and accumulates twice."""
    most = global_batch // written if written else global_batch
    for steps in range(1, global_batch + 1):
        if global_batch % (world * steps) == 0 and global_batch // (world * steps) <= most:
            return global_batch // (world * steps), steps
    raise UserError(
        f"a global batch of {global_batch} cannot be shared out evenly on {world} processes"
        + (f" with at most {most} samples each (as the {written} that wrote the checkpoint had)" if written else "")
        + f"; set train.batch_size to a multiple of {world}, or resume on a number of processes that divides it"
    )
