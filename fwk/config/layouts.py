"""The per-rank memory of a layout, estimated from the model's config before any work, without torch.

``fwk train --dry-run`` prints the mesh and this estimate for the layout the config asks
for and for the one that would need the least memory per rank. The parts, in bytes, are:

- model state: parameters, gradients and optimizer state, in fp32, with ``floats`` per
  parameter for the optimizer. It is divided by every degree that splits or shards them
  (``tp x pp x dp_shard``).
- activations: what autograd keeps per block for one micro-batch. After Korthikanti et al.
  2022 that is ``T x C x 34 + 5 x heads x T^2`` bytes per sample in 16-bit, doubled for fp32.
  It is multiplied by the blocks this rank holds, divided by ``tp``, and multiplied by the
  micro-batches a stage holds at once. That is all of them under gpipe, and up to the stage
  count under 1f1b.
- logits: the last stage's ``T x vocab`` per sample, kept for the loss's backward.

Only models whose config states their sizes, such as fwk's GPT, have an estimate. For the
others the dry run prints the mesh alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from fwk.config.schema import Config, layout
from fwk.distributed.dims import Dims

_FLOATS = {"sgd": 1, "lion": 1, "muon": 1}  # optimizer state per parameter (AdamW and the rest: 2)


@dataclass(frozen=True)
class Estimate:
    dims: Dims
    state: float  # bytes per rank
    activations: float

    @property
    def total(self) -> float:
        return self.state + self.activations

    def line(self) -> str:
        gib = 2**30
        return (
            f"{self.dims.label()}: ~{self.total / gib:.3g} GiB per rank (model state {self.state / gib:.3g}, "
            f"activations {self.activations / gib:.3g})"
        )


def _sizes(cfg: Config) -> tuple[int, int, int, int, int, int] | None:
    """Return the model's parameters, layers, width, heads, vocabulary and sequence length, if known."""
    m = cfg.model
    if getattr(m, "name", None) != "gpt":
        return None
    seq = getattr(cfg.data, "seq_len", None) or m.block_size
    params = m.vocab_size * m.n_embd + m.block_size * m.n_embd + m.n_layer * 12 * m.n_embd**2
    return params, m.n_layer, m.n_embd, m.n_head, m.vocab_size, seq


def estimate(cfg: Config, dims: Dims) -> Estimate | None:
    sizes = _sizes(cfg)
    if sizes is None:
        return None
    params, layers, width, heads, vocab, seq = sizes
    floats = _FLOATS.get(str(getattr(cfg.optim, "name", "")), 2)
    state = params * 4 * (2 + floats) / (dims.tp * dims.pp * dims.dp_shard)
    per_rank = cfg.train.batch_size // dims.batch_degree
    p = cfg.parallel
    micro = (p.pp_microbatches or 2 * dims.pp * p.pp_stages_per_rank) if dims.pp > 1 else 1
    held = micro if p.pp_schedule == "gpipe" else min(micro, dims.pp * p.pp_stages_per_rank)
    sample = 2 * (seq * width * 34 + 5 * heads * seq * seq)  # per block, fp32
    activations = (per_rank / micro) * held * (layers / dims.pp) * sample / dims.tp
    logits = (per_rank / micro) * seq * vocab * 4 * 2
    return Estimate(dims, state, activations + logits)


def candidates(cfg: Config) -> list[Dims]:
    """Return every layout of the world size that the model's sizes allow.

    In such a layout tp divides the heads, there is at most one stage per block, and the data
    degree divides the batch."""
    sizes = _sizes(cfg)
    world = cfg.world_size
    found = []
    for pp, tp, shard in product(range(1, world + 1), repeat=3):
        if world % (pp * tp * shard):
            continue
        dims = Dims(pp=pp, dp_replicate=world // (pp * tp * shard), dp_shard=shard, tp=tp)
        if sizes is not None and (sizes[3] % tp or pp > sizes[1]):
            continue
        if cfg.train.batch_size % dims.batch_degree or (dims.pp > 1 and dims.dp_shard > 1):
            continue
        found.append(dims)
    return found


def describe(cfg: Config) -> str:
    """Return the dry run's lines on the layout.

    They give the mesh, its memory estimate, and the estimate of the least memory a layout of
    the same processes would need."""
    dims, problem = layout(cfg.parallel, cfg.world_size)
    if dims is None:
        return f"mesh: {problem}"
    line = f"mesh {dims.label()} (data-parallel degree {dims.batch_degree})"
    chosen = estimate(cfg, dims)
    if chosen is None:
        return line
    others = [e for d in candidates(cfg) if d != dims and (e := estimate(cfg, d)) is not None]
    line += f"\nmemory estimate {chosen.line()}"
    if others:
        best = min(others, key=lambda e: e.total)
        line += f"\nnext best by memory: {best.line()}"
    return line
