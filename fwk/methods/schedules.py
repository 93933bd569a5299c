"""Methods that change the batch as a function of the step: ``seq_warmup`` (the GPT's
sequence length ramps up) and ``progressive_resize`` (images trained small first). Both
are pure functions of the step, so a resumed run sees the batches it would have seen."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fwk.methods.base import Method


class SeqWarmup(Method):
    """Composer's sequence-length warmup: about 1.5x to the same loss on GPT-2 125M."""

    name = "seq_warmup"
    tasks = ("lm",)

    def length(self, step: int, full: int) -> int:
        ramp = max(1, round(self.cfg.duration * self.max_steps))
        start = min(self.cfg.start_len, full)
        length = start + (full - start) * min(1.0, step / ramp)
        rounded = int(length) // self.cfg.multiple * self.cfg.multiple
        return max(min(full, start), min(full, rounded))

    def batch(self, step: int, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.length(step, x.size(1))
        return (x, y) if n == x.size(1) else (x[:, :n], y[:, :n])

    def describe(self) -> str:
        ramp = round(self.cfg.duration * self.max_steps)
        return f"seq_warmup: sequences from {self.cfg.start_len} tokens up to the full length over {ramp} steps"


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
        side = int(full * self.scale(step)) // self.cfg.size_increment * self.cfg.size_increment
        return min(full, max(self.cfg.size_increment, side))

    def batch(self, step: int, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.dim() != 4:
            return x, y
        h, w = x.shape[-2:]
        side_h, side_w = self.side(step, h), self.side(step, w)
        if (side_h, side_w) == (h, w):
            return x, y
        resized = F.interpolate(x.float(), size=(side_h, side_w), mode="bilinear", antialias=True, align_corners=False)
        return resized.to(x.dtype), y  # the step puts it channels-last where precision asks

    def describe(self) -> str:
        t = self.max_steps
        return (
            f"progressive_resize: images at {self.cfg.initial_scale:g}x their size until step "
            f"{round(self.cfg.delay_fraction * t)}, full size from step {round((1 - self.cfg.finetune_fraction) * t)}"
        )


class LabelSmoothing(Method):
    name = "label_smoothing"
    tasks = ("classification",)

    def label_smoothing(self) -> float | None:
        return self.cfg.smoothing

    def describe(self) -> str:
        return f"label_smoothing: cross-entropy against targets smoothed by {self.cfg.smoothing:g}"
