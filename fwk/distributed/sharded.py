"""What a rank holds, asked without importing the libraries that shard.

``torch.distributed.tensor`` takes 0.5 to 1 s to import (its sharding rules pull in sympy), and
``torch.distributed.fsdp`` more on top: a one-process run that never shards should not pay
that at start-up. No tensor can be a DTensor, and no module an ``FSDPModule``, before its module
is imported, so looking the class up in ``sys.modules`` answers without importing it.
"""

from __future__ import annotations

import sys
from typing import Any

from torch import nn


def _loaded(module: str, name: str) -> Any:
    """The class ``name`` of ``module`` if that module is imported already, else None."""
    found = sys.modules.get(module)
    return getattr(found, name, None) if found is not None else None


def is_dtensor(t: Any) -> bool:
    """Whether ``t`` is a DTensor (a shard of a tensor-parallel or FSDP parameter)."""
    cls = _loaded("torch.distributed.tensor", "DTensor")
    return cls is not None and isinstance(t, cls)


def is_sharded(model: nn.Module) -> bool:
    """Tell whether this rank holds less than the whole model as plain tensors: FSDP shards, tensor
    parallel's DTensors, or one pipeline stage (``fwk/strategies/pipeline.py``)."""
    fsdp_module = _loaded("torch.distributed.fsdp", "FSDPModule")
    if (fsdp_module is not None and isinstance(model, fsdp_module)) or getattr(model, "pipeline_part", False):
        return True
    return any(is_dtensor(p) for p in model.parameters())
