"""Kernels: config group ``kernels`` (read here and nowhere else).

``auto`` uses fwk's Triton kernels (``fwk/kernels``) on CUDA and plain PyTorch elsewhere.
``triton`` always uses them, on CPU only under ``TRITON_INTERPRET=1``, and ``torch`` never. With
the kernels on:
- every ``nn.LayerNorm`` / ``nn.RMSNorm`` of the model computes with the Triton kernels.
  The module's class is swapped in place, with the same parameters and state_dict keys.
- a model whose forward takes ``targets`` (the GPT) gets the chunked linear
  cross-entropy as its ``head_loss``, so the full logits are never materialised in training.
- the optimizer's step is fused (``fused`` to ``build_optimizer``: Triton Lion).
The modules it swaps are what precision's ``keep_fp32`` patterns and memory's
checkpointing match, and ``parallelize.py`` applies it first for that reason.
"""

from __future__ import annotations

import inspect
import logging
import os

import torch
from torch import nn

from fwk.config.schema import KernelsConfig
from fwk.errors import UserError

logger = logging.getLogger(__name__)


def use_triton(cfg: KernelsConfig, device: torch.device) -> bool:
    return cfg.name == "triton" or (cfg.name == "auto" and device.type == "cuda" and _importable())


def _importable() -> bool:
    from fwk.kernels import available

    return available()


def check_available(cfg: KernelsConfig, device: torch.device) -> None:
    """Check before any work that kernels=triton has Triton, and a GPU or the interpreter."""
    if cfg.name != "triton":
        return
    if not _importable():
        raise UserError("kernels=triton but Triton is not installed (pip install triton); use kernels=auto")
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise UserError(
            "kernels=triton needs a CUDA device (or TRITON_INTERPRET=1 for Triton's slow CPU interpreter); "
            "use kernels=auto"
        )


def takes_targets(model: nn.Module) -> bool:
    return "targets" in inspect.signature(model.forward).parameters


class Kernels:
    def __init__(self, cfg: KernelsConfig, device: torch.device) -> None:
        check_available(cfg, device)
        self.triton = use_triton(cfg, device)
        self.fused_loss = False

    def apply(self, model: nn.Module) -> nn.Module:
        """Swap in the Triton modules and the chunked head loss."""
        if not self.triton:
            logger.info(f"kernels: plain PyTorch{'' if torch.cuda.is_available() else ' (no CUDA device)'}")
            return model
        from fwk.kernels.cross_entropy import linear_cross_entropy
        from fwk.kernels.layernorm import LayerNorm
        from fwk.kernels.rmsnorm import RMSNorm

        swapped = 0
        for module in model.modules():
            for plain, fast in ((nn.LayerNorm, LayerNorm), (nn.RMSNorm, RMSNorm)):
                if type(module) is plain:
                    module.__class__ = fast  # same object, parameters and state_dict; Triton forward
                    swapped += 1
        if takes_targets(model) and hasattr(model, "head_loss"):
            model.head_loss = linear_cross_entropy
            self.fused_loss = True
        head = ", chunked linear cross-entropy" if self.fused_loss else ""
        logger.info(f"kernels: Triton for {swapped} norm layers{head}, fused optimizer step")
        return model
