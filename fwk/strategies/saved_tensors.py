"""A count of what a step holds for backward on the training device.

It is memory=auto's measure of activation memory on a CPU (``memory.py``), where no allocator
reports a peak."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch


class SavedTensorMeter:
    """A meter of the bytes held for backward on the training device: autograd's saved tensors
    plus the inputs checkpointed blocks keep.

    Saved tensors count once per storage, after offload moved them. The model's own parameters
    and buffers, also saved by autograd, are not activations and are left out (``ignore``)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.ignore: set[int] = set()
        self.active = False
        self.peak = 0
        self._seen: dict[int, int] = {}

    def leave_out(self, model: torch.nn.Module) -> None:
        """Count nothing that ``model``'s parameters and buffers hold. It is called again when a
        method replaced them."""
        tensors = [*model.parameters(), *model.buffers()]
        local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]  # a DTensor's own shard
        self.ignore = {t.untyped_storage().data_ptr() for t in local}

    def hold(self, t: Any) -> None:
        if isinstance(t, tuple):  # save_on_cpu packs (device, tensor)
            for part in t:
                self.hold(part)
        elif self.active and isinstance(t, torch.Tensor) and t.device.type == self.device.type:
            storage = t.untyped_storage()
            if storage.data_ptr() not in self.ignore:
                self._seen[storage.data_ptr()] = storage.nbytes()

    def counting(
        self, inner: torch.autograd.graph.saved_tensors_hooks | None, moved: Callable[[], int] | None = None
    ) -> contextlib.AbstractContextManager:
        """Return saved-tensor hooks that count what ``inner``, offload or none, keeps. ``moved``
        gives, at the block's end, the most bytes that ``inner`` held at once of the tensors it
        moved (offload's ``resident_peak``), which count too."""
        pack = inner.pack_hook if inner is not None else (lambda t: t)
        unpack = inner.unpack_hook if inner is not None else (lambda t: t)

        def counted(t: torch.Tensor) -> Any:
            packed = pack(t)
            self.hold(packed)
            return packed

        stack = contextlib.ExitStack()
        self.active = True
        stack.callback(lambda: self._close(moved() if moved is not None else 0))
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(counted, unpack))
        return stack

    def _close(self, moved: int) -> None:
        self.active = False
        self.peak = max(self.peak, sum(self._seen.values()) + moved)
        self._seen = {}

    def take(self) -> int:
        """Return the largest count of one counting block, one micro-batch, since the last take."""
        peak, self.peak = self.peak, 0
        return peak
