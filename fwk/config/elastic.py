"""The checks of an elastic node range (``parallel.nnodes=MIN:MAX``), made before any work.

They also check what the run computes on any machine count in the range. They are part of
fwk/config/validate.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fwk.config.schema import Config
from fwk.distributed.shares import split
from fwk.errors import UserError


def _splits(global_batch: int, nproc: int, nodes: int, written: int) -> bool:
    """Return True when ``nodes`` machines can go on with a run that ``written`` processes wrote."""
    try:
        split(global_batch, nproc * nodes, written)
    except UserError:
        return False
    return True


def elastic_rules(c: Config) -> Iterator[tuple[bool, str, Any, str]]:
    """Yield the rules of the range, its rendezvous and its timeouts: (holds, key, value, what is allowed)."""
    t, p, world = c.train, c.parallel, c.world_size
    yield 0 <= p.min_nnodes <= p.nnodes, "parallel.min_nnodes", p.min_nnodes, f"an integer in [0, {p.nnodes}]"
    elastic = 0 < p.min_nnodes < p.nnodes
    yield (
        not elastic or p.rdzv_backend == "c10d",
        "parallel.rdzv_backend",
        p.rdzv_backend,
        "c10d with an elastic range (parallel.min_nnodes < nnodes): static gives every machine a fixed rank",
    )
    timeout = p.collective_timeout_s
    yield timeout > 0, "parallel.collective_timeout_s", timeout, "an integer > 0 (seconds)"
    yield p.rdzv_last_call_s >= 0, "parallel.rdzv_last_call_s", p.rdzv_last_call_s, "an integer >= 0 (seconds)"
    shrunk = [k for k in range(max(p.min_nnodes, 1), p.nnodes) if not _splits(t.batch_size, p.nproc_per_node, k, world)]
    yield (
        not shrunk,
        "train.batch_size",
        t.batch_size,
        f"a global batch that {p.nproc_per_node} x {shrunk[0] if shrunk else 0} processes share evenly, each with at "
        f"most {t.batch_size // world} samples (after losing machines, parallel.nnodes={p.min_nnodes}:{p.nnodes})",
    )
