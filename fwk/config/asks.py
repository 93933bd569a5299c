"""What a resolved config asks of the model and the device before a launch.

It says which of the pre-flight checks (``fwk.strategies.preflight``) have anything to check.
It is torch-free, so that a launch of several workers skips importing torch in the launcher,
which takes seconds, when the config asks nothing of either. torchrun's agent and the workers
import torch anyway."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

MODULES = ("checkpoint", "auto")  # the memory strategies whose memory.modules is checked


@dataclass(frozen=True)
class Asks:
    format: str | None  # a format named (bf16, fp16): is it slow on this device?
    kernels: bool  # kernels=triton: is Triton there, and a GPU or its interpreter?
    arguments: bool  # a ``_target_`` model: does its class take the model keys the user typed, and build?
    muon: bool  # optim=muon typed: has the model hidden matrices for it?
    meta: bool  # the model built on the meta device: a ``_target_`` class, module patterns typed, fp16, Muon
    optimizer: bool  # a ``_target_`` optimizer: does its class build with the settings given?

    @property
    def anything(self) -> bool:
        return self.format is not None or self.kernels or self.arguments or self.meta or self.optimizer


def asks(cfg: Any, typed: Collection[str] = ()) -> Asks:
    """Return what ``cfg`` asks of the model and the device before a launch.

    ``typed`` holds the keys of the command's overrides. Muon is checked only where it is typed,
    since a recipe's Muon falls back in the trainer."""
    p, m = cfg.precision, cfg.memory
    named = p.name if p.name in ("bf16", "fp16") else p.dtype if p.name == "staged" and p.dtype != "auto" else None
    muon = getattr(cfg.optim, "name", None) == "muon" and "optim" in typed
    # a recipe's own patterns apply where they match (fwk.strategies.modules.fitting): only typed ones are checked
    patterns = {"precision.keep_fp32", "precision.final_fp32"} | ({"memory.modules"} if m.name in MODULES else set())
    target = isinstance(cfg.model, dict)
    meta = target or bool(patterns & set(typed)) or named == "fp16" or muon
    return Asks(named, cfg.kernels.name == "triton", target, muon, meta, optimizer=isinstance(cfg.optim, dict))
