"""``progressive_resize``: images trained small first, then larger, then at full size, a pure
function of the step, so a resumed run sees the batches it would have seen."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fwk.config.methods import Config, Rule
from fwk.methods.base import Method, method
from fwk.registry import doc

if TYPE_CHECKING:
    import torch


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

    def effects(self, c: Config) -> Iterator[str]:
        """Yield what this run could never act on (``fwk/config/effect.py``): images too small to resize."""
        full = getattr(c.data, "image_size", None)
        if full is not None and self.first_side(full) >= full:
            yield (
                f"methods=[progressive_resize] would never resize data.image_size={full} images: "
                f"method.progressive_resize.initial_scale={self.initial_scale:g} of them, rounded down to a multiple "
                f"of size_increment={self.size_increment}, is still {full} px; lower initial_scale or size_increment, "
                "or drop progressive_resize from methods"
            )

    def side(self, scale: float, full: int) -> int:
        """Return the side of ``full``-px images at ``scale``, rounded down to the increment, and at least one."""
        side = int(full * scale) // self.size_increment * self.size_increment
        return min(full, max(self.size_increment, side))

    def first_side(self, full: int) -> int:
        """Return the side of the first steps' images. It is the smallest it trains at, since the scale only grows."""
        return self.side(self.initial_scale, full)


@method(ProgressiveResizeConfig)
class ProgressiveResize(Method):
    """Composer's progressive resizing: ``initial_scale`` for the first ``delay_fraction``,
    a linear ramp, then the full size for the last ``finetune_fraction``."""

    name = "progressive_resize"
    tasks = ("classification",)

    def scale(self, step: int) -> float:
        t = step / max(1, self.max_steps)
        start, end = self.cfg.delay_fraction, 1.0 - self.cfg.finetune_fraction
        if t <= start:
            return self.cfg.initial_scale
        if t >= end or end <= start:
            return 1.0
        return self.cfg.initial_scale + (1.0 - self.cfg.initial_scale) * (t - start) / (end - start)

    def side(self, step: int, full: int) -> int:
        return self.cfg.side(self.scale(step), full)

    def batch(self, step: int, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.dim() != 4:
            return x, y
        h, w = x.shape[-2:]
        side_h, side_w = self.side(step, h), self.side(step, w)
        if (side_h, side_w) == (h, w):
            return x, y
        import torch.nn.functional as F

        resized = F.interpolate(x.float(), size=(side_h, side_w), mode="bilinear", antialias=True, align_corners=False)
        return resized.to(x.dtype), y  # the step puts it channels-last where precision asks

    def describe(self) -> str:
        t = self.max_steps
        return (
            f"progressive_resize: images at {self.cfg.initial_scale:g}x their size until step "
            f"{round(self.cfg.delay_fraction * t)}, full size from step {round((1 - self.cfg.finetune_fraction) * t)}"
        )
