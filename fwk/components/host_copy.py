"""Copies of training state kept in host memory, for a trial's snapshot in
``fwk/components/trials.py`` and for the NaN rollback in ``fwk/components/diagnostics.py``."""

from __future__ import annotations

import copy
from typing import Any

import torch


def host_copy(obj: Any) -> Any:
    """Copy a state dict so that later steps cannot change it. Tensors go to the host. Shards
    stay sharded on their device, since a copy there keeps their placement."""
    if isinstance(obj, torch.Tensor):
        if hasattr(obj, "to_local"):  # DTensor
            return obj.detach().clone()
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: host_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(host_copy(v) for v in obj)
    return copy.deepcopy(obj)  # numbers and strings as they are; anything mutable copied


def host_copy_into(held: Any, obj: Any) -> Any:
    """Write ``host_copy(obj)`` into ``held``, an earlier host copy of the same kind of state,
    where it fits. A host tensor of the same shape and dtype is overwritten in place, so that
    refreshing a snapshot allocates no new memory. Anything else is copied anew."""
    if isinstance(obj, torch.Tensor):
        fits = isinstance(held, torch.Tensor) and held.device.type == "cpu" and not hasattr(obj, "to_local")
        if fits and held.shape == obj.shape and held.dtype == obj.dtype and held is not obj:
            return held.copy_(obj.detach())
        return host_copy(obj)
    if isinstance(obj, dict):
        old = held if isinstance(held, dict) else {}
        return {k: host_copy_into(old.get(k), v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        old = held if isinstance(held, (list, tuple)) and len(held) == len(obj) else [None] * len(obj)
        return type(obj)(host_copy_into(h, v) for h, v in zip(old, obj, strict=True))
    return copy.deepcopy(obj)
