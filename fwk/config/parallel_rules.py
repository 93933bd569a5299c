"""The ``parallel`` section's checks.

They check the layout's degrees, what each layout cannot be combined with, and DDP's and the
monitor's own settings. They are torch-free. ``validate.py`` asks ``rules(c)``, and the model
section's ``check_layout(dims)`` checks what the degrees must divide in the model
(``fwk/config/resolve.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fwk.config.schema import BACKENDS, COMM_HOOKS, FP16_SHARDED, PP_SCHEDULES, Config, layout
from fwk.distributed.dims import PRESETS, Dims
from fwk.errors import UserError

Rule = tuple[bool, str, Any, str]


def world_rules(c: Config) -> Iterator[Rule]:
    """Yield the rows of the process count, which validate.py checks before any other: the
    others divide by the world size (a batch per rank, a layout's degrees)."""
    p = c.parallel
    yield p.nproc_per_node >= 1, "parallel.nproc_per_node", p.nproc_per_node, "an integer >= 1"
    yield p.nnodes >= 1, "parallel.nnodes", p.nnodes, "an integer >= 1"


def rules(c: Config) -> Iterator[Rule]:
    world, p = c.world_size, c.parallel
    yield p.name in PRESETS, "parallel.name", p.name, f"one of {', '.join(PRESETS)}"
    yield 0 <= p.node_rank < p.nnodes, "parallel.node_rank", p.node_rank, f"an integer in [0, {p.nnodes - 1}]"
    yield p.shard_size >= 0, "parallel.shard_size", p.shard_size, "an integer >= 0 (0 = nproc_per_node)"
    yield (
        not (p.name == "none" and world > 1),
        "parallel.name",
        p.name,
        f"ddp, fsdp, tp, pp, hybrid or auto when {world} processes train (parallel=none runs a single process)",
    )
    dims, problem = layout(p, world)
    if dims is None:  # a sentence of its own: which degrees, what they multiply to, what would fit
        raise UserError(problem)
    yield from _layout_rules(c, dims)
    yield from _model_rules(c, dims)
    yield p.backend in BACKENDS, "parallel.backend", p.backend, f"one of {', '.join(BACKENDS)}"
    yield p.max_restarts >= 0, "parallel.max_restarts", p.max_restarts, "an integer >= 0"
    yield p.bucket_cap_mb > 0, "parallel.bucket_cap_mb", p.bucket_cap_mb, "a number > 0"
    yield p.comm_hook in COMM_HOOKS, "parallel.comm_hook", p.comm_hook, f"one of {', '.join(COMM_HOOKS)}"
    yield p.powersgd_rank >= 1, "parallel.powersgd_rank", p.powersgd_rank, "an integer >= 1"
    yield p.powersgd_start >= 2, "parallel.powersgd_start", p.powersgd_start, "an integer >= 2"
    yield 0 < p.auto_memory_share <= 1, "parallel.auto_memory_share", p.auto_memory_share, "a number in (0, 1]"


def _layout_rules(c: Config, dims: Dims) -> Iterator[Rule]:
    p, t = c.parallel, c.train
    yield (
        t.batch_size % dims.batch_degree == 0,
        "train.batch_size",
        t.batch_size,
        f"a multiple of the data-parallel degree {dims.batch_degree} (dp_replicate x dp_shard of {dims.label()})",
    )
    fp16 = c.precision.name == "fp16" or (c.precision.name == "staged" and c.precision.dtype == "fp16")
    yield (
        not (fp16 and (dims.shards or dims.splits_model)),
        "precision.name",
        c.precision.name,
        f"bf16 or fp32 under {dims.label()} ({FP16_SHARDED}), or parallel=ddp for fp16",
    )
    if dims.splits_model:
        yield (
            c.jit.name != "compile",
            "jit.name",
            c.jit.name,
            f"off or auto under {dims.label()} (tensor and pipeline parallel run eager in fwk; auto stays eager)",
        )
        yield (
            c.memory.name not in ("offload", "microbatch", "auto"),
            "memory.name",
            c.memory.name,
            f"none or checkpoint under {dims.label()} (a pipeline cuts micro-batches itself: parallel.pp_microbatches)",
        )
        yield (
            c.kernels.name != "triton",
            "kernels.name",
            c.kernels.name,
            f"auto or torch under {dims.label()} (the Triton norms and chunked head loss take whole tensors)",
        )
    yield p.pp_schedule in PP_SCHEDULES, "parallel.pp_schedule", p.pp_schedule, f"one of {', '.join(PP_SCHEDULES)}"
    yield p.pp_microbatches >= 0, "parallel.pp_microbatches", p.pp_microbatches, "an integer >= 0 (0 = 2 x stages)"
    multi = p.pp_schedule in ("interleaved_1f1b", "zero_bubble")
    least = 2 if multi and dims.pp > 1 else 1
    yield (
        p.pp_stages_per_rank >= least and (multi or p.pp_stages_per_rank == 1),
        "parallel.pp_stages_per_rank",
        p.pp_stages_per_rank,
        f"an integer >= 2 with pp_schedule={p.pp_schedule}" if multi else f"1 with pp_schedule={p.pp_schedule}",
    )
    yield (
        not (dims.pp > 1 and dims.dp_shard > 1),
        "parallel.dp_shard",
        p.dp_shard,
        f"1 with parallel.pp={dims.pp} (FSDP of pipeline stages is not built yet): replicate with "
        "parallel.dp_replicate, or shard without pp",
    )
    if dims.pp > 1:
        stages = dims.pp * p.pp_stages_per_rank
        micro = p.pp_microbatches or 2 * stages
        per_rank = t.batch_size // dims.batch_degree
        yield (
            per_rank % micro == 0,
            "parallel.pp_microbatches",
            micro,
            f"a divisor of the per-rank batch {per_rank} (train.batch_size / data-parallel degree)",
        )
        yield (
            p.pp_schedule != "1f1b" or micro >= dims.pp,
            "parallel.pp_microbatches",
            micro,
            f"at least the {dims.pp} stages with pp_schedule=1f1b",
        )


def _model_rules(c: Config, dims: Dims) -> Iterator[Rule]:
    """Yield what the degrees must divide in the model, asked of its config (``check_layout``).

    A registered model whose config has no ``check_layout`` has no tensor-parallel plan and no
    pipeline split. These are the CNNs and ResNets, whose convolutions gain nothing from either.
    A model of the user's own (``_target_``) is asked once built, in ``fwk/strategies/tensor.py``
    and ``pipeline.py``."""
    model = c.model
    if isinstance(model, dict) or not dims.splits_model:
        return
    check = getattr(model, "check_layout", None)
    if check is not None:
        yield from check(dims, c.parallel.pp_stages_per_rank)
        return
    for key, degree in (("tp", dims.tp), ("pp", dims.pp)):
        yield (
            degree == 1,
            f"parallel.{key}",
            degree,
            f"1 with model={model.name} (it has no tensor-parallel plan or pipeline split: its convolutions "
            "gain nothing from either); use parallel=ddp or fsdp",
        )
