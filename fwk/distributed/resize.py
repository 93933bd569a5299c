"""How a run resumes on another number of processes, or another layout, than wrote its checkpoint.

``train.batch_size`` is the global batch, so the same command on another world size is the
same run and computes the same steps. Its id leaves the process count out, and the training
order is defined globally (fwk/data/loader.py ``TrainLoader``). On fewer processes each
keeps the per-process batch of the run that wrote the checkpoint and makes the global batch
up with accumulation, so memory stays as it was. On more, each takes its smaller share
(fwk/distributed/shares.py).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def written_batch_degree(checkpoints: Path) -> int | None:
    """Return the data-parallel degree of the run that wrote the newest complete checkpoint
    under ``checkpoints``: the number of batches a step took. Before layouts had other
    dimensions (``fwk/distributed/dims.py``), that was its world size."""
    manifests = sorted(checkpoints.glob("step-*/manifest.json")) if checkpoints.is_dir() else []
    for manifest in reversed(manifests):
        try:
            written = json.loads(manifest.read_text())
            return int(written.get("batch_degree", written["world_size"]))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # a damaged one: Checkpointer decides what to do with it
    return None


def derived_seed(seed: int, step: int, rank: int) -> int:
    """Derive a rank's RNG seed at a step from the run's seed alone. A resume on another world
    size has no RNG file for some of its ranks, and needs none."""
    digest = hashlib.sha256(f"{seed}:{step}:{rank}".encode()).digest()
    return int.from_bytes(digest[:4], "little")  # 32 bits: numpy's legacy seeding takes no more
