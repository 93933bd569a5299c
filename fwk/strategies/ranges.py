"""Per-module value ranges: the largest |activation| and |gradient| each leaf module saw.

Forward hooks read each leaf module's output; a tensor hook on that output reads its
gradient in backward. Maxima stay on the device (no sync per module) until ``read()``.
The hooks are meant for a few steps: ``remove()`` takes them all off again.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


class RangeProbe:
    def __init__(self, model: nn.Module) -> None:
        self.names: list[str] = []
        self._act: dict[str, torch.Tensor] = {}
        self._grad: dict[str, torch.Tensor] = {}
        self._handles = []
        for name, module in model.named_modules():
            if name and not any(True for _ in module.children()):
                self.names.append(name)
                self._handles.append(module.register_forward_hook(self._forward_hook(name)))

    def _update(self, store: dict[str, torch.Tensor], name: str, t: torch.Tensor) -> None:
        if t.numel() == 0:
            return
        value = t.detach().abs().amax().float()
        store[name] = torch.maximum(store[name], value) if name in store else value

    def _forward_hook(self, name: str):
        @torch.compiler.disable  # bookkeeping for a few steps: not worth tracing into a compiled graph
        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            for t in _tensors(output):
                self._update(self._act, name, t)
                if t.requires_grad:
                    t.register_hook(lambda g, n=name: self._update(self._grad, n, g))

        return hook

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def read(self) -> dict[str, tuple[float, float]]:
        """Return name -> (largest |activation|, largest |gradient|), with 0.0 where none was seen."""
        zero = torch.zeros(())
        names = self.names
        act = torch.stack([self._act.get(n, zero).cpu() for n in names]) if names else zero
        grad = torch.stack([self._grad.get(n, zero).cpu() for n in names]) if names else zero
        return {n: (float(a), float(g)) for n, a, g in zip(names, act.tolist(), grad.tolist(), strict=False)}


def describe(ranges: dict[str, tuple[float, float]], steps: int, hot: list[str], limit: float) -> str:
    """Describe the ranges in one line.

    The line reads ``ranges over 10 steps: largest activation ... (module), largest gradient ...``.
    """
    act = max(ranges.items(), key=lambda kv: kv[1][0])
    grad = max(ranges.items(), key=lambda kv: kv[1][1])
    moved = f"; {len(hot)} module(s) above {limit:.0f} join keep_fp32: {', '.join(hot)}" if hot else ""
    return (
        f"ranges over {steps} steps: largest activation {act[1][0]:.3g} ({act[0]}), "
        f"largest gradient {grad[1][1]:.3g} ({grad[0]}){moved}"
    )
