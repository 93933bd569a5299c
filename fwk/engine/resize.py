"""Resuming a run on another number of processes than wrote its checkpoint.

``train.batch_size`` is the global batch, so the same command on another world size is the
same run (its id leaves the process count out) and computes the same steps: the training
order is defined globally (fwk/data/loader.py ``TrainLoader``). On fewer processes each
keeps the per-process batch of the run that wrote the checkpoint and makes the global batch
up with accumulation (memory stays as it was); on more, each takes its smaller share.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from fwk.errors import UserError


def written_world_size(checkpoints: Path) -> int | None:
    """The process count that wrote the newest complete checkpoint under ``checkpoints``."""
    manifests = sorted(checkpoints.glob("step-*/manifest.json")) if checkpoints.is_dir() else []
    for manifest in reversed(manifests):
        try:
            return int(json.loads(manifest.read_text())["world_size"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a damaged one: Checkpointer decides what to do with it
    return None


def split(global_batch: int, world: int, written: int | None) -> tuple[int, int]:
    """(per-process batch, accumulation steps) that keep ``global_batch`` on ``world``
    processes, for a checkpoint written by ``written`` (None: a new run).

    The fewest accumulation steps whose per-process batch divides the global batch evenly
    and is no larger than the written run's (its memory fitted): on half the processes,
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


def derived_seed(seed: int, step: int, rank: int) -> int:
    """A rank's RNG seed at a step, from the run's seed alone: a resume on another world size
    has no RNG file for some of its ranks, and needs none."""
    digest = hashlib.sha256(f"{seed}:{step}:{rank}".encode()).digest()
    return int.from_bytes(digest[:4], "little")  # 32 bits: numpy's legacy seeding takes no more
