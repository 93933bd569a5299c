"""``seq_warmup``: the GPT's sequence length ramps up, a pure function of the step, so a
resumed run sees the batches it would have seen."""

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

    def effects(self, c: Config) -> Iterator[str]:
        """Yield what this run could never act on (``fwk/config/effect.py``).
        That is a start as long as the data's sequences."""
        full = getattr(c.data, "seq_len", None)
        if full is not None and self.start_len >= full:
            yield (
                f"method.seq_warmup.start_len={self.start_len} is not below data.seq_len={full}: every step would "
                "train full-length sequences; lower start_len, or drop seq_warmup from methods"
            )


@method(SeqWarmupConfig)
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
