"""The settings of each speed-up method (``method.NAME.*``; ``methods=[...]`` says which
run, fwk/methods/ runs them). Torch-free, as the rest of the schema.

Each method's settings check themselves: ``rules(c)`` yields ``Rule``s (holds, key, value,
what is allowed) on its own values, and, when the method runs, on what it cannot be
combined with. ``fwk/config/validate.py`` asks each one and names none.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from fwk.registry import doc

Rule = tuple[bool, str, Any, str]  # (holds, key, value, what is allowed)
Config = Any  # fwk.config.schema.Config, the whole typed config (that module imports this one)
SHARDED = ("fsdp", "hsdp")

METHODS = ("ema", "label_smoothing", "seq_warmup", "progressive_resize", "prune_gradually")


@dataclass
class EmaConfig:
    """An exponential moving average of the weights, used by evaluation, best checkpoints and export."""

    half_life: float = doc(100.0, "steps over which an earlier weight's share in the average halves")

    def rules(self, c: Config) -> Iterator[Rule]:
        yield self.half_life > 0, "method.ema.half_life", self.half_life, "a number of steps > 0"
        if "ema" in c.methods:
            yield (
                c.parallel.name not in SHARDED,
                "methods",
                list(c.methods),
                "no ema with parallel=fsdp/hsdp (the average would hold the whole model on every rank); "
                "use parallel=ddp",
            )


@dataclass
class LabelSmoothingConfig:
    """Cross-entropy against smoothed targets (classification)."""

    smoothing: float = doc(0.1, "share of the target's mass spread over the other classes, in (0, 1)")

    def rules(self, c: Config) -> Iterator[Rule]:
        yield 0 < self.smoothing < 1, "method.label_smoothing.smoothing", self.smoothing, "a number in (0, 1)"


@dataclass
class SeqWarmupConfig:
    """The GPT's sequence length ramps from start_len to data.seq_len (a function of the step)."""

    start_len: int = doc(16, "sequence length of the first step")
    duration: float = doc(0.3, "share of train.max_steps over which the length ramps up to the full length")
    multiple: int = doc(8, "lengths are rounded down to a multiple of this (fewer distinct shapes to compile)")

    def rules(self, c: Config) -> Iterator[Rule]:
        yield self.start_len >= 1, "method.seq_warmup.start_len", self.start_len, "an integer >= 1"
        share = "a share of train.max_steps in (0, 1]"
        yield 0 < self.duration <= 1, "method.seq_warmup.duration", self.duration, share
        yield self.multiple >= 1, "method.seq_warmup.multiple", self.multiple, "an integer >= 1"


@dataclass
class ProgressiveResizeConfig:
    """Images trained small first, then larger, then at full size (Composer's progressive resizing)."""

    initial_scale: float = doc(0.5, "side of the first steps' images, as a share of the full size")
    delay_fraction: float = doc(0.4, "share of train.max_steps at initial_scale before the ramp starts")
    finetune_fraction: float = doc(0.2, "share of train.max_steps at the end at the full size")
    size_increment: int = doc(4, "sides are rounded down to a multiple of this")

    def rules(self, c: Config) -> Iterator[Rule]:
        key = "method.progressive_resize."
        yield 0 < self.initial_scale <= 1, f"{key}initial_scale", self.initial_scale, "a number in (0, 1]"
        delay, finetune = self.delay_fraction, self.finetune_fraction
        yield (
            0 <= delay and 0 <= finetune and delay + finetune <= 1,
            f"{key}delay_fraction",
            delay,
            "a share in [0, 1] with delay_fraction + finetune_fraction <= 1",
        )
        yield self.size_increment >= 1, f"{key}size_increment", self.size_increment, "an integer >= 1"

    def first_side(self, full: int) -> int:
        """Side of the first steps' images for ``full``-px ones, as fwk/methods/schedules.py's
        ``ProgressiveResize.side`` rounds it (tests/config/test_effect.py holds the two equal):
        the smallest side it trains at, since the scale only grows."""
        side = int(full * self.initial_scale) // self.size_increment * self.size_increment
        return min(full, max(self.size_increment, side))


@dataclass
class PruneGraduallyConfig:
    """Channels (and attention heads) removed in even stages during training (torch-pruning)."""

    ratio: float = doc(0.5, "share of the channels (and heads) removed by the last stage, in (0, 1)")
    steps: int = doc(4, "number of even pruning stages, each removing the same share of the channels left")
    start: float = doc(0.1, "share of train.max_steps after which the first stage prunes")
    end: float = doc(0.5, "share of train.max_steps after which the last stage prunes")
    round_to: int = doc(8, "the last stage keeps channel counts at multiples of this (where every layer keeps 4x)")

    def rules(self, c: Config) -> Iterator[Rule]:
        """Its settings, and what it cannot be combined with."""
        key = "method.prune_gradually."
        yield 0 < self.ratio < 1, f"{key}ratio", self.ratio, "a share in (0, 1)"
        yield self.steps >= 1, f"{key}steps", self.steps, "an integer >= 1"
        share = "a share of train.max_steps with 0 <= start <= end < 1"
        yield 0 <= self.start <= self.end < 1, f"{key}start", self.start, share
        yield self.round_to >= 1, f"{key}round_to", self.round_to, "an integer >= 1"
        if "prune_gradually" not in c.methods:
            return
        yield (
            c.parallel.name not in SHARDED,
            "parallel.name",
            c.parallel.name,
            "ddp, none or auto with methods=[prune_gradually] (it slices whole weights; FSDP holds shards)",
        )
        yield (
            "ema" not in c.methods,
            "methods",
            list(c.methods),
            "no ema with prune_gradually (the average would keep the removed channels); drop one",
        )
        yield (
            c.memory.name == "none",
            "memory.name",
            c.memory.name,
            "none with methods=[prune_gradually] (torch-pruning traces the model's graph, which activation "
            "checkpointing hides)",
        )


@dataclass
class MethodConfig:
    """Each method's settings (``methods=[...]`` says which run; fwk/methods/)."""

    ema: EmaConfig = field(default_factory=EmaConfig, metadata={"doc": "methods=[ema]"})
    label_smoothing: LabelSmoothingConfig = field(
        default_factory=LabelSmoothingConfig, metadata={"doc": "methods=[label_smoothing]"}
    )
    seq_warmup: SeqWarmupConfig = field(default_factory=SeqWarmupConfig, metadata={"doc": "methods=[seq_warmup]"})
    progressive_resize: ProgressiveResizeConfig = field(
        default_factory=ProgressiveResizeConfig, metadata={"doc": "methods=[progressive_resize]"}
    )
    prune_gradually: PruneGraduallyConfig = field(
        default_factory=PruneGraduallyConfig, metadata={"doc": "methods=[prune_gradually]"}
    )


def rules(c: Config) -> Iterator[Rule]:
    """Every method's settings' own rules, in the order ``METHODS`` lists them."""
    for name in METHODS:
        yield from getattr(c.method, name).rules(c)


def label_smoothing(config: dict[str, Any]) -> float:
    """The label smoothing a resolved config (as a dict) trains with: ``methods=[label_smoothing]``'s, else 0."""
    return float(config["method"]["label_smoothing"]["smoothing"]) if "label_smoothing" in config["methods"] else 0.0
