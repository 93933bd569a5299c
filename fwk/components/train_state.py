"""What a training step's state is, apart from the files it goes to: every RNG a step draws
from, and the model and optimizer state as whole tensors or this rank's FSDP shards.

The checkpointer (fwk/components/checkpoint.py) writes these; decision trials
(fwk/components/trials.py), diagnostics rollbacks and the resumable bundle read and restore
them in memory without a file.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from torch import nn

from fwk.distributed.sharded import is_sharded


def rng_state() -> dict[str, Any]:
    """Return every RNG a training step may draw from, as tensors and plain Python values."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state(
        ("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def model_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Return the model and optimizer state to checkpoint. That is full tensors, or this rank's
    shards under FSDP."""
    if is_sharded(model):
        from fwk.strategies import fsdp  # torch.distributed.fsdp: imported by sharded runs only

        return fsdp.model_state(model, optimizer, flat=True)
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def named_model_state(model: nn.Module, optimizer: torch.optim.Optimizer, flat: bool = True) -> dict[str, Any]:
    """Return the model and optimizer state keyed by parameter names. That is this rank's
    shards, or whole tensors when the model is not sharded. A sharded checkpoint loads into it
    on any number of processes and any layout, since torch.distributed.checkpoint reshards as
    it reads. ``flat`` keeps the optimizer state as one entry per parameter and value.
    Checkpoints are written so, since pipeline stages hold different parameters. Pass False for
    checkpoints written before."""
    from fwk.strategies import fsdp

    return fsdp.model_state(model, optimizer, flat)


def _by_name(optimizer_state: dict[str, Any]) -> bool:
    """Tell whether an optimizer state is keyed by parameter names, as in
    torch.distributed.checkpoint's layouts, nested or flat. Return False for
    ``Optimizer.state_dict()``'s parameter indices."""
    if is_flat(optimizer_state):
        return True
    groups = optimizer_state.get("param_groups") or [{}]
    return any(isinstance(p, str) for p in groups[0].get("params", []))


def is_flat(optimizer_state: dict[str, Any]) -> bool:
    """Tell whether an optimizer state is flattened by name ("state.NAME.exp_avg",
    "param_groups.NAME.lr")."""
    return any(isinstance(k, str) and k.startswith(("state.", "param_groups.")) for k in optimizer_state)


def load_model_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    sharded = is_sharded(model)
    if sharded or _by_name(state["optimizer"]):
        from fwk.strategies import fsdp

        if sharded and not _by_name(state["optimizer"]):  # written unsharded, by one process
            fsdp.load_whole_state(model, optimizer, state)
        else:
            fsdp.load_model_state(model, optimizer, state)
    else:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
