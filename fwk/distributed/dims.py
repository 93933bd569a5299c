"""The job's processes as named dimensions of one device mesh: plain arithmetic, no torch.

A layout is four degrees whose product is the world size, as torchtitan's ``ParallelDims``:
``pp`` pipeline stages, ``dp_replicate`` model replicas, ``dp_shard`` FSDP shards, ``tp``
tensor-parallel ranks. Ranks are laid out row-major in that order, so ``tp`` is innermost:
tensor-parallel peers are neighbours, on one machine, where the network is fastest.

The batch dimension is ``dp_replicate x dp_shard``: the loaders, the streamed sets and the
checkpoint's data positions ask ``batch_degree`` and ``batch_rank``, never the world size.
Tensor-parallel peers and the stages of one pipeline see the same samples.

The config check uses it before any work (``fwk/config/validate.py``), and so does every
worker (``fwk/distributed/group.py``, ``mesh.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NAMES = ("pp", "dp_replicate", "dp_shard", "tp")  # mesh order: outermost first
PRESETS = ("auto", "none", "ddp", "fsdp", "hsdp", "tp", "pp", "hybrid")  # conf/parallel/*.yaml
# parallel.* keys that choose the layout, not what is computed. They are left out of the run id,
# since a run resumes under another layout, and a relaunch uses its own (fwk/track/)
LAYOUT = ("name", *NAMES, "shard_size", "pp_schedule", "pp_microbatches", "pp_stages_per_rank")


@dataclass(frozen=True)
class Dims:
    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1

    @property
    def world(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.tp

    @property
    def batch_degree(self) -> int:
        """Return how many different batches one step takes: the data-parallel degree."""
        return self.dp_replicate * self.dp_shard

    def coords(self, rank: int) -> dict[str, int]:
        """Return this rank's place along each dimension."""
        out, rest = {}, rank
        for name in reversed(NAMES):
            size = getattr(self, name)
            out[name], rest = rest % size, rest // size
        return {n: out[n] for n in NAMES}

    def batch_rank(self, rank: int) -> int:
        """Return which of the ``batch_degree`` batches this rank takes."""
        c = self.coords(rank)
        return c["dp_replicate"] * self.dp_shard + c["dp_shard"]

    def reports(self, rank: int) -> bool:
        """Tell whether this rank counts its batch's loss and metrics. One rank per batch does:
        the first tensor-parallel rank of the last pipeline stage. The others compute the same
        numbers, or none."""
        c = self.coords(rank)
        return c["tp"] == 0 and c["pp"] == self.pp - 1

    @property
    def shards(self) -> bool:
        """Tell whether FSDP shards the model, over ``dp_shard``. It is HSDP when ``dp_replicate`` > 1 too."""
        return self.dp_shard > 1

    @property
    def splits_model(self) -> bool:
        """Tell whether tensor or pipeline parallel splits the model, so that no rank holds all of it."""
        return self.tp > 1 or self.pp > 1

    def label(self) -> str:
        """Return the degrees above 1 as ``pp=2 x dp_shard=2``, or ``one process`` when there are none."""
        parts = [f"{n}={getattr(self, n)}" for n in NAMES if getattr(self, n) > 1]
        return " x ".join(parts) or "one process"


def resolve(degrees: dict[str, int], world: int, nproc_per_node: int, shard_size: int = 0) -> tuple[Dims | None, str]:
    """Return the layout for ``parallel.{pp,dp_replicate,dp_shard,tp}`` on ``world`` processes.

    It returns (the layout, "") or (None, what is wrong and what would fit). ``-1`` on one
    degree takes what the others leave. ``dp_shard=0`` shards over one machine's processes, or
    over ``parallel.shard_size`` when set, as hsdp's groups do. The rest replicate across machines."""
    given = {n: int(degrees.get(n, 1)) for n in NAMES}
    if given["dp_shard"] == 0:
        given["dp_shard"] = shard_size or max(1, nproc_per_node // (given["tp"] * max(given["pp"], 1)))
    bad = [n for n, v in given.items() if v == 0 or v < -1]
    if bad:
        return None, f"parallel.{bad[0]}={given[bad[0]]}: a degree is an integer >= 1, or -1 (what is left)"
    free = [n for n, v in given.items() if v == -1]
    if len(free) > 1:
        return None, f"parallel.{free[0]} and parallel.{free[1]} are both -1: at most one degree takes what is left"
    fixed = 1
    for v in given.values():
        fixed *= v if v != -1 else 1
    if free:
        if world % fixed:
            return None, _mismatch(given, world, fixed)
        given[free[0]] = world // fixed
    dims = Dims(**given)
    if dims.world != world:
        return None, _mismatch(given, world, dims.world)
    return dims, ""


def _mismatch(given: dict[str, int], world: int, product: int) -> str:
    shown = " x ".join(f"{n}={v}" for n, v in given.items() if v != 1)
    return (
        f"parallel degrees {shown or 'all 1'} multiply to {product}, but {world} processes train "
        f"(parallel.nproc_per_node x parallel.nnodes); make the product {world}, "
        "or set one degree to -1 to take what is left"
    )


def layout(p: Any, world: int) -> tuple[Dims | None, str]:
    """Return the degrees of a ``parallel`` config section and "", or None and what is wrong.
    ``parallel=auto`` gives the data dimension whatever the set degrees leave, replicated. The
    strategy may shard it."""
    degrees = {n: getattr(p, n) for n in NAMES}
    if p.name == "auto" and -1 not in degrees.values():
        degrees["dp_replicate"] = -1
    return resolve(degrees, world, p.nproc_per_node, p.shard_size)


def shards_model(c: Any) -> bool:
    """Tell whether no rank of config ``c`` holds the whole model as plain tensors: FSDP, tensor
    or pipeline parallel. The methods that hold whole weights refuse those."""
    dims, _ = layout(c.parallel, c.world_size)
    return dims is not None and (dims.shards or dims.splits_model)
