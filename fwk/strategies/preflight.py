"""Checks that need the model or the device, run before a run dir exists, so that a config
that cannot work is one line before anything is launched or written."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch
from torch import nn

from fwk.config.asks import asks
from fwk.config.instantiate import instantiate, model_arguments
from fwk.errors import UserError
from fwk.models.registry import MODELS
from fwk.optim import build_optimizer
from fwk.strategies import hardware, kernels, memory, precision


def preflight(cfg: Any, typed: Collection[str] = ()) -> list[str]:
    """Run the checks that need the model or the device, before any run dir exists.

    They check that the module patterns of precision and memory that the user typed match,
    that a ``_target_`` model and optimizer take the settings given, and that the device runs
    the asked format and kernels. ``typed`` holds the keys of the command's overrides. Return
    the lines to say before the run starts: an asked format that is slow on this device.

    The model is built on the meta device: its structure without allocating its weights.
    """
    asked = asks(cfg, typed)
    if asked.arguments:
        section, dropped = model_arguments(cfg.model)
        typed_here = [k for k in dropped if f"model.{k}" in typed]
        if typed_here:
            raise UserError(
                f"model.{typed_here[0]}: {section['_target_']} takes no argument '{typed_here[0]}'; "
                "give only the arguments of its __init__"
            )
    if asked.optimizer:  # a class of your own: built once on a small layer, so a wrong setting is one line now
        build_optimizer(cfg.optim, nn.Linear(2, 2))
    cuda = cfg.train.device == "cuda" or (cfg.train.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if cuda else "cpu")
    kernels.check_available(cfg.kernels, device)
    slow = hardware.slow_here(asked.format, hardware.probe(device), device) if asked.format else None
    notes = [f"precision={cfg.precision.name} is slow here: {slow}"] if slow else []
    if not asked.meta:
        return notes
    with torch.device("meta"):
        model = (
            instantiate(model_arguments(cfg.model)[0])
            if isinstance(cfg.model, dict)
            else MODELS.get(cfg.model.name).builder(cfg.model)
        )
    precision.check_model(cfg.precision, model, device, typed)
    memory.check_model(cfg.memory, model, typed)
    if asked.muon:
        from fwk.optim.muon import check_model as check_muon

        check_muon(model)
    return notes
