"""The settings of each speed-up method (``method.NAME.*``; ``methods=[...]`` says which
run, fwk/methods/ runs them). Torch-free, as the rest of the schema."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fwk.registry import doc

METHODS = ("ema", "label_smoothing", "seq_warmup", "progressive_resize", "prune_gradually")


@dataclass
class EmaConfig:
    """An exponential moving average of the weights, used by evaluation, best checkpoints and export."""

    half_life: float = doc(100.0, "steps over which an earlier weight's share in the average halves")


@dataclass
class LabelSmoothingConfig:
    """Cross-entropy against smoothed targets (classification)."""

    smoothing: float = doc(0.1, "share of the target's mass spread over the other classes, in (0, 1)")


@dataclass
class SeqWarmupConfig:
    """The GPT's sequence length ramps from start_len to data.seq_len (a function of the step)."""

    start_len: int = doc(16, "sequence length of the first step")
    duration: float = doc(0.3, "share of train.max_steps over which the length ramps up to the full length")
    multiple: int = doc(8, "lengths are rounded down to a multiple of this (fewer distinct shapes to compile)")


@dataclass
class ProgressiveResizeConfig:
    """Images trained small first, then larger, then at full size (Composer's progressive resizing)."""

    initial_scale: float = doc(0.5, "side of the first steps' images, as a share of the full size")
    delay_fraction: float = doc(0.4, "share of train.max_steps at initial_scale before the ramp starts")
    finetune_fraction: float = doc(0.2, "share of train.max_steps at the end at the full size")
    size_increment: int = doc(4, "sides are rounded down to a multiple of this")

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


def label_smoothing(config: dict[str, Any]) -> float:
    """The label smoothing a resolved config (as a dict) trains with: ``methods=[label_smoothing]``'s, else 0."""
    return float(config["method"]["label_smoothing"]["smoothing"]) if "label_smoothing" in config["methods"] else 0.0
